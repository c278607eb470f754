"""Where a job starts: its checkpoint policy, the checkpoint ``resume=`` names, and the refusal
of a directory holding another job's checkpoints.

Spark never retries a failed barrier *result* stage, so the driver does: when a stage fails
with a worker's error (process killed, executor lost, a collective timing out), the job's
:class:`~sparkdp.driver.controller.Controller` starts a new stage from the latest checkpoint
(the barrier kind's plan, driver/jobs/barrier.py), as the job's restart policy allows. Errors a
restart cannot fix (bad configuration or data, a diverged loss) are raised at once.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ..config import JobConfig
from ..errors import ConfigError
from ..frozen import load_model_state
from ..train.checkpoint import (
    SERIES,
    SHARDED_SERIES,
    Checkpoint,
    CheckpointPolicy,
    check_compatible,
    latest_checkpoint,
)
from ..train.checkpoint_manager import CheckpointManager
from ..train.checkpoint_store import new_job_id
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
    names = CheckpointManager.reader(directory, job.checkpoints.checkpoint_storage_options).others(lineage)
    if names:
        shown = ", ".join(names[-3:]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        todo = (
            (
                f"To continue that job, resume it: resume={directory!r} (--resume {directory}); to start "
                "afresh, give an empty or new directory (or delete those files)."
            )
            if job.checkpoints.resume is None
            else (
                f"This job resumes from {str(job.checkpoints.resume)!r}: give it a checkpoint_dir of its own (an empty or new "
                "directory), or remove the other job's files."
            )
        )
        raise ConfigError(
            f"checkpoint_dir={directory!r} already holds checkpoints of another job ({shown}). Writing beside "
            f"them would mix two jobs' checkpoints, and a restart could resume the wrong weights. {todo}"
        )


@contextmanager
def checkpoint_policy(
    job: JobConfig, temporary_ok: bool, job_id: str | None = None
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
        settings = replace(job.checkpoints, checkpoint_dir=str(directory))
        policy = CheckpointPolicy(settings, job_id or new_job_id())
        policy.manager().check_writable()
        yield policy
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def resumed_job(job: JobConfig, series: Collection[str]) -> str | None:
    """The job whose checkpoints (of ``series``) ``resume=`` continues: ``resume_job`` when given,
    else the one job with such checkpoints in the directory; None when there are none. Several
    jobs' checkpoints there are a ``ConfigError`` listing them: resuming the newest would continue
    whichever job wrote last, maybe not the one meant."""
    directory = str(job.checkpoints.resume)
    # job -> its newest checkpoint of series
    newest = CheckpointManager.reader(directory, job.checkpoints.checkpoint_storage_options).jobs(series)
    chosen = job.checkpoints.resume_job
    if chosen is not None and newest and chosen not in newest:
        raise ConfigError(
            f"resume_job={chosen!r}: {directory!r} holds no checkpoint of that job; it holds "
            f"{_jobs(newest)}. Give one of those identities, or point resume at that job's directory."
        )
    if chosen is None and len(newest) > 1:
        raise ConfigError(
            f"resume={directory!r} holds checkpoints of {len(newest)} jobs: {_jobs(newest)}. Say which "
            "to continue with resume_job=JOB (--resume-job JOB), or give each job a directory of its own."
        )
    return chosen or next(iter(newest), None)


def _jobs(newest: dict[str, str]) -> str:
    return ", ".join(f"{job} (newest {name})" for job, name in sorted(newest.items()))


def resume_point(job: JobConfig) -> Checkpoint | None:
    """The checkpoint ``resume=`` names, or None without ``resume``: the newest readable one of
    the job :func:`resumed_job` chooses."""
    if job.checkpoints.resume is None:
        return None
    job_id = resumed_job(job, (SERIES, SHARDED_SERIES))
    found = (
        latest_checkpoint(job.checkpoints.resume, job_id, settings=job.checkpoints)
        if job_id is not None
        else None
    )
    if found is None:
        raise ConfigError(
            f"resume={job.checkpoints.resume!r}: no readable checkpoint (ckpt-e*-s*-*.safetensors, or "
            "shards-e*-s*-*.manifest.json with its directory) there. "
            "Point resume at the checkpoint_dir of an earlier run, or leave it unset to start afresh."
        )
    log.info("resuming job %s from %s", found.job_id, found.path)
    return found


def resume_spec(spec: FitSpec, job: JobConfig) -> tuple[FitSpec, str | None]:
    """``spec`` continued from ``job``'s resume point, if any, and the job's identity (a resumed
    job keeps its checkpoints'); another job's checkpoints in the directory are refused."""
    start = resume_point(job)
    lineage = start.job_id if start is not None else None
    refuse_foreign_checkpoints(job, lineage)
    if start is not None:
        spec = resumed(spec, start)
    return spec, lineage


def resumed(spec: FitSpec, checkpoint: Checkpoint, workers: int | None = None) -> FitSpec:
    """``spec`` continuing from ``checkpoint``: its weights, strategy state and position.

    On another number of ``workers`` than the checkpoint's, the data is re-sharded and a
    mid-epoch position becomes the step that covers about as many rows. A sharded checkpoint's
    weights and optimizer tensors stay in its shards: the workers load them (``part.shards``),
    each its new share, and a model they do not fit is refused there.
    """
    if not checkpoint.shards:  # a sharded one's weights the workers load, resharded to their number
        check_compatible(spec.model, checkpoint)
        load_model_state(spec.model, checkpoint.model)
    spec.strategy.load_state_dict(checkpoint.strategy_state)
    step = checkpoint.step
    if workers is not None and workers != checkpoint.workers:
        step = round(step * checkpoint.workers / workers)
    part = StagePart(
        start_epoch=checkpoint.epoch,
        optimizer_state=checkpoint.optimizer or None,
        start_step=step,
        rng=tuple(checkpoint.rng),
        history=tuple(checkpoint.history),
        epoch_stats=checkpoint.epoch_stats,
        shards=checkpoint.shards or None,
    )
    return replace(spec, part=part)


def where_from(checkpoint: Checkpoint | None) -> str:
    """Where a restart from ``checkpoint`` continues, for the controller's log line."""
    if checkpoint is None:
        return "the start (no checkpoint yet)"
    return (
        f"epoch {checkpoint.epoch + 1}, step {checkpoint.step}"
        if checkpoint.step
        else f"the start of epoch {checkpoint.epoch + 1}"
    )


def merged_history(report: WorkerReport, finished: FitSpec) -> tuple[list[dict[str, Any]], int, float]:
    """(history, samples, training seconds) of the whole job, earlier stages included."""
    before = list(finished.part.history)
    history = before + list(report.history)
    return (
        history,
        sum(int(h["samples"]) for h in before) + report.samples,
        sum(float(h["epoch_time_s"]) for h in before) + report.train_time_s,
    )
