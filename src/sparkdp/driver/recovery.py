"""Jobs that survive a lost worker: checkpoints, resume, and the one restart policy.

Spark never retries a failed barrier *result* stage, so the driver does: when a stage fails
with a worker's error (process killed, executor lost, a collective timing out), it starts a
new stage from the latest checkpoint (a streamed DataFrame: from the epoch's start), as the
job's :class:`RestartPolicy` allows, logging one line per restart. Errors a restart cannot fix
(bad configuration or data, a diverged loss) are raised at once.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ..config import JobConfig
from ..errors import ConfigError, TrainingDiverged, WorkerFailed, WorkerHung
from ..train.checkpoint import Checkpoint, CheckpointPolicy, check_compatible, latest_checkpoint
from ..train.checkpoint_store import CheckpointName, CheckpointStore, new_job_id, parse_name
from ..train.faults import fault_from_env
from ..train.loop import FitSpec, StagePart
from ..train.report import WorkerReport

log = logging.getLogger(__name__)


def refuse_foreign_checkpoints(job: JobConfig, lineage: str | None = None) -> None:
    """Refuse, before training, a checkpoint directory that holds another job's checkpoints.

    Every kind counts (synchronous, the driver's server, server tasks', directory checkpoints:
    one name matcher, :func:`~sparkdp.train.checkpoint_store.parse_name`). A job that does not
    resume owns none of the checkpoints already there: writing beside them would mix two jobs'
    files, and a restart could resume the wrong one's weights. A job that resumes (``lineage``:
    the identity of the checkpoint it resumes) may write beside its own checkpoints, not beside
    another job's."""
    directory = job.checkpoints.checkpoint_dir or job.checkpoints.resume
    if directory is None:
        return
    directory = str(directory)
    store = CheckpointStore(directory, "reader", storage_options=job.checkpoints.checkpoint_storage_options)
    names = [n for n in store.names() if lineage is None or cast(CheckpointName, parse_name(n)).job_id != lineage]
    if names:
        shown = ", ".join(names[-3:]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        todo = (f"To continue that job, resume it: resume={directory!r} (--resume {directory}); to start "
                "afresh, give an empty or new directory (or delete those files).") if job.checkpoints.resume is None else \
            (f"This job resumes from {str(job.checkpoints.resume)!r}: give it a checkpoint_dir of its own (an empty or new "
             "directory), or remove the other job's files.")
        raise ConfigError(
            f"checkpoint_dir={directory!r} already holds checkpoints of another job ({shown}). Writing beside "
            f"them would mix two jobs' checkpoints, and a restart could resume the wrong weights. {todo}")


@contextmanager
def checkpoint_policy(job: JobConfig, temporary_ok: bool, job_id: str | None = None
                      ) -> Iterator[CheckpointPolicy | None]:
    """The job's checkpoint policy. Without ``checkpoint_dir``/``resume``, a temporary directory
    (removed afterwards) still lets the driver restart a failed stage, when ``temporary_ok``
    (the executors share the driver's disk) and restarts are allowed. ``job_id``: the identity
    of the checkpoint a resumed job started from, so its new checkpoints continue that job's."""
    directory, temporary = job.checkpoints.checkpoint_dir or job.checkpoints.resume, None
    if directory is None:
        if not temporary_ok or job.failures.max_restarts == 0:
            yield None
            return
        directory = temporary = tempfile.mkdtemp(prefix="sparkdp-checkpoints-")
    try:
        policy = CheckpointPolicy(str(directory), job.checkpoints, job_id or new_job_id())
        policy.store().check_writable()
        yield policy
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def resume_point(job: JobConfig) -> Checkpoint | None:
    """The checkpoint ``resume=`` names, or None without ``resume``."""
    if job.checkpoints.resume is None:
        return None
    found = latest_checkpoint(job.checkpoints.resume, settings=job.checkpoints)
    if found is None:
        raise ConfigError(f"resume={job.checkpoints.resume!r}: no readable checkpoint (ckpt-e*-s*-*.safetensors) there. "
                          "Point resume at the checkpoint_dir of an earlier run, or leave it unset to start afresh.")
    return found


def resumed(spec: FitSpec, checkpoint: Checkpoint, workers: int | None = None) -> FitSpec:
    """``spec`` continuing from ``checkpoint``: its weights, strategy state and position.

    On another number of ``workers`` than the checkpoint's, the data is re-sharded and a
    mid-epoch position becomes the step that covers about as many rows.
    """
    check_compatible(spec.model, checkpoint)
    spec.model.load_state_dict(checkpoint.model)
    spec.strategy.load_state_dict(checkpoint.strategy_state)
    last = spec.last_epoch()
    step = checkpoint.step
    if workers is not None and workers != checkpoint.workers:
        step = round(step * checkpoint.workers / workers)
    part = StagePart(start_epoch=checkpoint.epoch, last_epoch=last, optimizer_state=checkpoint.optimizer or None,
                     start_step=step, rng=tuple(checkpoint.rng), history=tuple(checkpoint.history),
                     epoch_stats=checkpoint.epoch_stats)
    return replace(spec, epochs=last + 1 - checkpoint.epoch, part=part)


def _where(checkpoint: Checkpoint | None) -> str:
    if checkpoint is None:
        return "the start (no checkpoint yet)"
    return f"epoch {checkpoint.epoch + 1}, step {checkpoint.step}" if checkpoint.step else \
        f"the start of epoch {checkpoint.epoch + 1}"


@dataclass
class RestartPolicy:
    """When and on how many workers a failed job continues: the one policy of every runner.

    ``max_restarts`` failures are recovered over the whole job; after a failure that took task
    slots away, the job continues on the slots left, down to ``min_workers`` (None: always the
    full count), and grows back when they return. Each failure is one warning line: its cause,
    the restart's number, where it continues from and on how many workers."""

    max_restarts: int
    min_workers: int | None = None
    pg_timeout_s: float = 60.0
    #: one record per failure: its cause, where the job continued from, on how many workers, and
    #: how long the failed attempt had run (its work after the checkpoint resumed from was redone)
    failures: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, job: JobConfig) -> RestartPolicy:
        return cls(job.failures.max_restarts, job.failures.min_workers, job.failures.pg_timeout_s)

    def workers(self, requested: int, slots: int | None) -> int:
        """All ``requested`` workers if the slots are there (or unknown); else as many as fit, down
        to ``min_workers`` (below it, the stage waits for slots and fails after start_timeout_s)."""
        if self.min_workers is None or slots is None or slots >= requested:
            return requested
        return max(self.min_workers, slots)

    def recover(self, exc: WorkerFailed, requested: int, slots: int | None, where: str,
                can_restart: bool = True, attempt_s: float = 0.0) -> int:
        """After ``exc`` (in an attempt that ran ``attempt_s`` seconds): the workers to continue
        on, with the one log line; raises when the failures are more than ``max_restarts`` (or
        ``can_restart`` is False)."""
        cause = self.cause(exc)
        self.failures.append({"cause": cause, "restart_from": where, "attempt_s": attempt_s})
        if not can_restart or len(self.failures) > self.max_restarts:
            if len(self.failures) == 1:
                raise exc
            listed = "; ".join(f"{i + 1}: {f['cause']}" for i, f in enumerate(self.failures))
            raise WorkerFailed(f"the job failed {len(self.failures)} times, more than max_restarts="
                               f"{self.max_restarts} allows ({listed}). Fix the cause, or raise "
                               "max_restarts.") from exc
        now = self.workers(requested, slots)
        self.failures[-1]["workers"] = now
        log.warning("sparkdp: %s -- restart %d of %d from %s%s", cause, len(self.failures), self.max_restarts, where,
                    f" on {now} of {requested} workers (task slots gone)" if now < requested else "")
        return now

    def cause(self, exc: WorkerFailed) -> str:
        """One line for the log: what failed, where."""
        first = str(exc).strip().splitlines()[0]
        if isinstance(exc, WorkerHung):  # the stalled worker, named by the one that waited (train.loop)
            return f"{first} (after {self.pg_timeout_s:g} s)"
        return first


def run_with_restarts(spec: FitSpec, restarts: RestartPolicy, policy: CheckpointPolicy | None,
                      run_stage: Callable[[FitSpec, int], WorkerReport], workers: int,
                      slots: Callable[[], int | None] = lambda: None) -> tuple[WorkerReport, FitSpec, int]:
    """Run the stage on ``workers``; after a worker failure, restart it from the latest checkpoint
    as ``restarts`` allows (on fewer workers if ``slots()`` says fewer are left).

    Returns rank 0's report, the spec of the stage that finished (its ``part.history`` is the
    job's history before that stage) and the workers it ran on.
    """
    fault = fault_from_env()
    attempt, now = replace(spec, checkpoint=policy, fault=fault), workers
    while True:
        began = time.perf_counter()
        try:
            return run_stage(attempt, now), attempt, now
        except TrainingDiverged as exc:
            last = latest_checkpoint(policy.directory, policy.job_id, policy.settings) if policy is not None else None
            raise TrainingDiverged(f"{exc} The last good checkpoint: "
                                   f"{last.path if last is not None else 'none'}.") from None
        except WorkerFailed as exc:
            latest = latest_checkpoint(policy.directory, policy.job_id, policy.settings) if policy is not None else None
            now = restarts.recover(exc, workers, slots(), _where(latest), can_restart=policy is not None,
                                   attempt_s=time.perf_counter() - began)
            attempt = replace(resumed(spec, latest, now) if latest is not None else spec, checkpoint=policy, fault=None)


def merged_history(report: WorkerReport, finished: FitSpec) -> tuple[list[dict[str, Any]], int, float]:
    """(history, samples, training seconds) of the whole job, earlier stages included."""
    before = list(finished.part.history)
    history = before + list(report.history)
    return (history, sum(int(h["samples"]) for h in before) + report.samples,
            sum(float(h["epoch_time_s"]) for h in before) + report.train_time_s)
