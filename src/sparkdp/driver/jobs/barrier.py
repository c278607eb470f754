"""The barrier kind: a synchronous job on in-memory or Parquet data as one barrier stage whose
workers share a ``torch.distributed`` process group, resumed and restarted from checkpoints
(and ``sparkdp.run`` / ``launch`` with a synchronous strategy, restarted from the start)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...comm.base import Collective
from ...errors import TrainingDiverged
from ...frozen import load_model_state
from ...state import state_from_bytes
from ...strategies.base import Strategy
from ...train.checkpoint import Checkpoint, CheckpointPolicy, latest_checkpoint
from ...train.faults import fault_from_env
from ...train.jobs import in_task
from ...train.loop import FitSpec, fit_worker
from ...train.report import WorkerReport
from ...train.result import TrainResult
from ..controller import Attempt, Controller
from ..memory_advice import out_of_memory_explained
from ..preemption import decommission_notice
from ..recovery import checkpoint_policy, merged_history, resume_spec, resumed, where_from
from .base import Body, JobRun

log = logging.getLogger(__name__)

#: where a restarted ``sparkdp.run`` / ``launch`` continues: the user's code resumes itself
_OWN_CHECKPOINTS = "the start (the workers' own code resumes from its checkpoints)"


class Barrier:
    """One barrier stage (in-memory or Parquet data), resumed and restarted from checkpoints."""

    label = "Spark workers"

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        from ...spark.cluster import available_slots, on_driver_machine

        job, spark, workers = run.job, run.spark, run.workers
        spec, lineage = resume_spec(spec, job)

        def run_stage(stage: FitSpec, now: Attempt) -> WorkerReport:
            first, last = stage.part.start_epoch + 1, stage.last_epoch() + 1
            with decommission_notice(spark, stage.checkpoint):
                return WorkerReport.joined(
                    barrier_tasks(
                        lambda coll: fit_worker(stage, coll),
                        now,
                        run,
                        f"sparkdp {stage.strategy.name} on {now.workers} workers: epochs {first}-{last} of {last}",
                    )
                )

        controller = run.controller(lambda: available_slots(spark))
        with (
            out_of_memory_explained(spec, workers),
            checkpoint_policy(job, temporary_ok=on_driver_machine(spark), job_id=lineage) as policy,
        ):
            report, finished, ran_on = run_with_restarts(spec, controller, policy, run_stage)
        return trained(report, finished, ran_on, spec.epochs, run.started, controller)

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        from ...spark.cluster import available_slots

        def attempt(now: Attempt) -> Any:
            results = barrier_tasks(lambda collective: body(collective, strategy, now), now, run, description)
            return results[0]

        return run.controller(lambda: available_slots(run.spark)).run(FromStart(attempt))


class FromStart:
    """The plan of ``sparkdp.run`` / ``launch``: every attempt runs the workers' code from its start."""

    def __init__(self, attempt: Callable[[Attempt], Any]) -> None:
        self.attempt = attempt

    def restart_point(self) -> str:
        return _OWN_CHECKPOINTS


def barrier_tasks(
    body: Callable[[Collective], Any], attempt: Attempt, run: JobRun, description: str
) -> list[Any]:
    """``body(collective)`` on ``attempt.workers`` barrier tasks sharing a process group; their
    results in rank order. The tasks see the attempt's restart number and the job's ``max_restarts`` as torchrun's."""
    from ...spark.launcher import run_barrier

    job = run.job
    task = in_task(
        body,
        threads=job.scaling.threads,
        pg_timeout_s=job.failures.pg_timeout_s,
        restarts=(attempt.restart, job.failures.max_restarts),
    )
    return run_barrier(
        task,
        attempt.workers,
        spark=run.spark,
        start_timeout_s=job.failures.start_timeout_s,
        description=description,
    )


class SpecPlan:
    """The plan of a job whose attempt is one stage over a :class:`FitSpec`: a restart continues
    from the job's newest checkpoint, re-sharded to the workers it runs on."""

    def __init__(
        self,
        spec: FitSpec,
        policy: CheckpointPolicy | None,
        run_stage: Callable[[FitSpec, Attempt], WorkerReport],
    ) -> None:
        self.spec, self.policy, self.run_stage = spec, policy, run_stage
        self.finished = spec  # the spec of the attempt that finished

    def attempt(self, attempt: Attempt) -> WorkerReport:
        if attempt.restart == 0:  # an injected fault fires in the first attempt only
            spec = replace(self.spec, checkpoint=self.policy, fault=fault_from_env())
        else:
            latest = self._latest()
            start = resumed(self.spec, latest, attempt.workers) if latest is not None else self.spec
            spec = replace(start, checkpoint=self.policy, fault=None)
        self.finished = spec
        try:
            return self.run_stage(spec, attempt)
        except TrainingDiverged as exc:
            last = self._latest()
            raise TrainingDiverged(
                f"{exc} The last good checkpoint: {last.path if last is not None else 'none'}."
            ) from None

    def restart_point(self) -> str | None:
        return where_from(self._latest()) if self.policy is not None else None

    def _latest(self) -> Checkpoint | None:
        return (
            latest_checkpoint(self.policy.directory, self.policy.job_id, self.policy.settings)
            if self.policy is not None
            else None
        )


def run_with_restarts(
    spec: FitSpec,
    controller: Controller[Any],
    policy: CheckpointPolicy | None,
    run_stage: Callable[[FitSpec, Attempt], WorkerReport],
) -> tuple[WorkerReport, FitSpec, int]:
    """Run the stage under the job's ``controller``: after a worker failure, restart it from the
    latest checkpoint as the controller's policy allows (on fewer workers if its slots say fewer
    are left). ``run_stage(spec, attempt)`` runs one attempt (its workers, and its restart
    number, which the workers see as torchrun's).

    Returns rank 0's report, the spec of the stage that finished (its ``part.history`` is the
    job's history before that stage) and the workers it ran on.
    """
    plan = SpecPlan(spec, policy, run_stage)
    report = controller.run(plan)
    return report, plan.finished, controller.now


def trained(
    report: WorkerReport,
    finished: FitSpec,
    workers: int,
    epochs: int,
    started: float,
    controller: Controller[Any],
) -> TrainResult:
    """A synchronous job's result: rank 0's report of the stage that finished, earlier stages'
    history first, and the failures recovered on the way."""
    dropped = report.data_counters.get("dropped_null_rows", 0)
    if dropped:
        log.warning(
            "dropped %d row(s) with null features or labels (drop_nulls=True), counted over all epochs",
            dropped,
        )
    load_model_state(finished.model, state_from_bytes(report.state))
    history, samples, train_time = merged_history(report, finished)
    details = {
        "strategy_state": report.strategy_state,
        # rank 0's communication figures; a synchronous strategy's are every rank's
        "comm": dict(report.strategy_metrics),
        # per worker: peak RSS and model-state bytes (train.memory)
        "memory": list(report.memory),
        # when rank 0's loop of the stage that finished started and reported (time.time()): with
        # train_time_s they split the job's time outside training into before, in and after the workers
        "worker_wall": {"start": report.wall_start, "end": report.wall_end},
    }
    return TrainResult(
        model=finished.model,
        history=history,
        strategy=finished.strategy.name,
        workers=workers,
        epochs=epochs,
        wall_s=time.perf_counter() - started,
        train_time_s=train_time,
        samples=samples,
        strategy_options=report.strategy_options,
        details=controller.record(details),
    )


__all__ = ["Barrier", "FromStart", "SpecPlan", "barrier_tasks", "run_with_restarts", "trained"]
