"""How a job's workers run on Spark: one :class:`JobRunner` per launch plan, chosen once.

* :class:`BarrierRunner`: a synchronous job on in-memory or Parquet data: one barrier stage
  whose workers share a ``torch.distributed`` process group, restarted from checkpoints.
* :class:`StreamRunner`: a synchronous job on a streamed Spark DataFrame: a barrier
  ``mapInArrow`` stage per epoch; the driver holds the state between epochs.
* :class:`TaskRunner`: an asynchronous job: ordinary Spark tasks around a parameter server on
  the driver, or (``servers=K``) one barrier stage of server and worker tasks.

Every runner, for ``fit`` and ``run``/``launch`` alike, runs its attempts through the one
:class:`~sparkdp.driver.controller.Controller` under the job's ``FailureConfig``, which logs
one line per failure and one per recovery. :func:`runner_for` is the one place a strategy's
``Launcher`` is read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from ..config import JobConfig
from ..errors import ConfigError
from ..frozen import load_model_state
from ..state import state_from_bytes
from ..strategies.async_ps import AsyncParameterServer
from ..strategies.base import Launcher, Strategy
from ..train.jobs import in_task
from ..train.loop import FitSpec, fit_worker
from ..train.report import WorkerReport
from ..train.result import TrainResult
from .controller import Attempt, Controller, RestartPolicy
from .memory_advice import out_of_memory_explained
from .preemption import decommission_notice
from .recovery import (
    checkpoint_policy,
    merged_history,
    refuse_foreign_checkpoints,
    resume_point,
    resumed,
    run_with_restarts,
)
from .streamed import fit_epochs

log = logging.getLogger(__name__)


#: what ``sparkdp.run`` runs on every worker: ``body(collective, strategy, attempt)``
Body = Callable[[Any, Strategy, Attempt], Any]

#: where a restarted ``sparkdp.run`` / ``launch`` continues: the user's code resumes itself
_OWN_CHECKPOINTS = "the start (the workers' own code resumes from its checkpoints)"


class JobRunner(Protocol):
    """Runs a job's workers on Spark and recovers from their failures."""

    #: what the progress line calls the workers
    kind: str

    def fit(
        self, spec: FitSpec, job: JobConfig, workers: int, spark: Any, hub: Any, started: float
    ) -> TrainResult:
        """Train ``spec`` (``spec.model`` ends up trained) and return the job's result."""
        ...

    def call(
        self,
        body: Body,
        strategy: Strategy,
        job: JobConfig,
        workers: int,
        spark: Any,
        hub: Any,
        description: str,
    ) -> Any:
        """Run ``body(collective, strategy, attempt)`` on every worker (``sparkdp.run``), restarted
        from the start as the job's restart policy allows; rank 0's result."""
        ...


def runner_for(strategy: Strategy, streamed: bool) -> JobRunner:
    """The runner for ``strategy``'s launch kind, on streamed DataFrame data or not."""
    if strategy.launcher is Launcher.TASKS:
        if streamed:
            raise ConfigError(
                f"the asynchronous strategy {strategy.name!r} reads in-memory data or Parquet "
                "files; a DataFrame that is not a plain Parquet scan is supported by the synchronous "
                "strategies. Write it to Parquet and pass the path."
            )
        return TaskRunner()
    return StreamRunner() if streamed else BarrierRunner()


def _resume(spec: FitSpec, job: JobConfig) -> tuple[FitSpec, str | None]:
    """``spec`` continued from ``job``'s resume point, if any, and the job's identity (a resumed
    job keeps its checkpoints'); another job's checkpoints in the directory are refused."""
    start = resume_point(job)
    lineage = start.job_id if start is not None else None
    refuse_foreign_checkpoints(job, lineage)
    if start is not None:
        spec = resumed(spec, start)
    return spec, lineage


class BarrierRunner:
    """One barrier stage (in-memory or Parquet data), resumed and restarted from checkpoints."""

    kind = "Spark workers"

    def fit(
        self, spec: FitSpec, job: JobConfig, workers: int, spark: Any, hub: Any, started: float
    ) -> TrainResult:
        from ..spark.cluster import available_slots, on_driver_machine

        spec, lineage = _resume(spec, job)

        def run_stage(stage: FitSpec, now: Attempt) -> WorkerReport:
            first, last = stage.part.start_epoch + 1, stage.last_epoch() + 1
            with decommission_notice(spark, stage.checkpoint):
                return WorkerReport.joined(
                    _barrier(
                        lambda coll: fit_worker(stage, coll),
                        now,
                        job,
                        spark,
                        f"sparkdp {stage.strategy.name} on {now.workers} workers: epochs {first}-{last} of {last}",
                    )
                )

        restarts = RestartPolicy.of(job)
        with (
            out_of_memory_explained(spec, workers),
            checkpoint_policy(job, temporary_ok=on_driver_machine(spark), job_id=lineage) as policy,
        ):
            report, finished, ran_on = run_with_restarts(
                spec, restarts, policy, run_stage, workers, slots=lambda: available_slots(spark)
            )
        return trained(report, finished, ran_on, spec.epochs, started, restarts)

    def call(
        self,
        body: Body,
        strategy: Strategy,
        job: JobConfig,
        workers: int,
        spark: Any,
        hub: Any,
        description: str,
    ) -> Any:
        from ..spark.cluster import available_slots

        def attempt(now: Attempt) -> Any:
            results = _barrier(
                lambda collective: body(collective, strategy, now), now, job, spark, description
            )
            return results[0]

        return Controller(RestartPolicy.of(job), workers, lambda: available_slots(spark)).run(
            _FromStart(attempt)
        )


class _FromStart:
    """The plan of ``sparkdp.run`` / ``launch``: every attempt runs the workers' code from its start."""

    def __init__(self, attempt: Callable[[Attempt], Any]) -> None:
        self.attempt = attempt

    def restart_point(self) -> str:
        return _OWN_CHECKPOINTS


def _barrier(
    body: Callable[[Any], Any], attempt: Attempt, job: JobConfig, spark: Any, description: str
) -> list[Any]:
    """``body(collective)`` on ``attempt.workers`` barrier tasks sharing a process group; their
    results in rank order. The tasks see the attempt's restart number and the job's ``max_restarts`` as torchrun's."""
    from ..spark.launcher import run_barrier

    task = in_task(
        body,
        threads=job.scaling.threads,
        pg_timeout_s=job.failures.pg_timeout_s,
        restarts=(attempt.restart, job.failures.max_restarts),
    )
    return run_barrier(
        task,
        attempt.workers,
        spark=spark,
        start_timeout_s=job.failures.start_timeout_s,
        description=description,
    )


class StreamRunner:
    """A streamed DataFrame: one barrier stage per epoch; the driver reruns a failed epoch itself."""

    kind = "Spark workers"

    def fit(
        self, spec: FitSpec, job: JobConfig, workers: int, spark: Any, hub: Any, started: float
    ) -> TrainResult:
        from ..spark.cluster import available_slots

        spec, lineage = _resume(spec, job)
        # the driver holds every epoch's state anyway: no temporary directory is needed
        restarts = RestartPolicy.of(job)
        controller: Controller[WorkerReport] = Controller(restarts, workers, lambda: available_slots(spark))
        with (
            out_of_memory_explained(spec, workers),
            checkpoint_policy(job, temporary_ok=False, job_id=lineage) as policy,
        ):
            # a streamed DataFrame's spec carries its source (a spark.dataframe.DataFrameSource) on the driver
            report = fit_epochs(spec, spec.train, job, controller, spark, policy)
            ran_on = controller.now
        return trained(report, spec, ran_on, spec.epochs, started, restarts)

    def call(
        self,
        body: Body,
        strategy: Strategy,
        job: JobConfig,
        workers: int,
        spark: Any,
        hub: Any,
        description: str,
    ) -> Any:
        raise ConfigError(
            "a streamed DataFrame is training data for sparkdp.fit; sparkdp.run calls your own loop."
        )


class TaskRunner:
    """Ordinary Spark tasks around a parameter server on the driver (a restarted task pulls the
    current centre and continues its sequence numbers), or servers on the executors."""

    kind = "asynchronous Spark workers"

    def fit(
        self, spec: FitSpec, job: JobConfig, workers: int, spark: Any, hub: Any, started: float
    ) -> TrainResult:
        from .async_job import fit_async, server_lineage
        from .server_tasks import fit_on_executors

        lineage = server_lineage(job)  # a resumed job keeps the identity of the checkpoints it resumes
        refuse_foreign_checkpoints(job, lineage)
        run = fit_on_executors if cast(AsyncParameterServer, spec.strategy).servers else fit_async
        return run(spec, job, workers=workers, spark=spark, started=started, hub=hub, job_id=lineage)

    def call(
        self,
        body: Body,
        strategy: Strategy,
        job: JobConfig,
        workers: int,
        spark: Any,
        hub: Any,
        description: str,
    ) -> Any:
        from .async_job import run_async

        if cast(AsyncParameterServer, strategy).servers:
            raise ConfigError(
                "servers=K (parameter servers on the executors) trains through sparkdp.fit and "
                "`sparkdp train`; sparkdp.run and `sparkdp launch` use the server on the driver: "
                "leave servers unset."
            )
        return run_async(
            lambda _w, collective, shipped, attempt: body(collective, shipped, attempt),
            cast(AsyncParameterServer, strategy),  # a Launcher.TASKS strategy
            workers=workers,
            spark=spark,
            threads=job.scaling.threads,
            description=description,
            restarts=RestartPolicy.of(job),
            hub=hub,
            start_timeout_s=job.failures.start_timeout_s,
        )[0]


def trained(
    report: WorkerReport,
    finished: FitSpec,
    workers: int,
    epochs: int,
    started: float,
    restarts: RestartPolicy,
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
        details={
            "strategy_state": report.strategy_state,
            # rank 0's communication figures; a synchronous strategy's are every rank's
            "comm": dict(report.strategy_metrics),
            # per worker: peak RSS and model-state bytes (train.memory)
            "memory": list(report.memory),
            "restarts": list(restarts.failures),
            # preemptions: restarts that saved first, not counted against max_restarts
            "preemptions": list(restarts.preemptions),
        },
    )


__all__ = ["BarrierRunner", "JobRunner", "StreamRunner", "TaskRunner", "runner_for", "trained"]
