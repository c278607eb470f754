"""The stream kind: a synchronous job on a streamed Spark DataFrame, one barrier ``mapInArrow``
stage per epoch, each restarted by the job's controller.

The driver holds the model, optimizer and strategy state at every epoch's end (rank 0 returns
them), so a failed epoch stage runs again from the start of that epoch; that state is also
saved as the epoch's checkpoint when the job has a checkpoint directory. A stop the driver's
epoch listener asked for (a pruned search trial; it answered rank 0's epoch results before the
stage ended) ends the job before the next epoch's stage.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...config import JobConfig
from ...errors import ConfigError
from ...export.record import model_record
from ...frozen import load_model_state
from ...state import state_from_bytes
from ...strategies.base import Strategy
from ...train.checkpoint import CheckpointPolicy, save_checkpoint
from ...train.faults import fault_from_env
from ...train.loop import FitSpec, StagePart
from ...train.report import WorkerReport
from ...train.result import TrainResult
from ..controller import Attempt, Controller
from ..memory_advice import out_of_memory_explained
from ..recovery import checkpoint_policy, resume_spec
from .barrier import trained
from .base import Body, JobRun

log = logging.getLogger(__name__)


class Stream:
    """A streamed DataFrame: one barrier stage per epoch; the driver reruns a failed epoch itself."""

    label = "Spark workers"

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        from ...spark.cluster import available_slots

        job, spark = run.job, run.spark
        spec, lineage = resume_spec(spec, job)
        controller = run.controller(lambda: available_slots(spark))
        # the driver holds every epoch's state anyway: no temporary directory is needed
        with (
            out_of_memory_explained(spec, run.workers),
            checkpoint_policy(job, temporary_ok=False, job_id=lineage) as policy,
        ):
            # a streamed DataFrame's spec carries its source (a spark.dataframe.DataFrameSource) on the driver
            hub = run.hub
            report = fit_epochs(
                spec, spec.train, job, controller, spark, policy,
                stop_requested=lambda: hub is not None and hub.stop_requested,
            )  # fmt: skip
        return trained(report, spec, controller.now, spec.epochs, run.started, controller)

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        raise ConfigError(
            "a streamed DataFrame is training data for sparkdp.fit; sparkdp.run calls your own loop."
        )


class EpochPlan:
    """One epoch of a streamed DataFrame as the controller's plan: a restart runs it again from
    the state the driver holds at the epoch's start."""

    def __init__(
        self, run_epoch: Callable[[FitSpec, Attempt], WorkerReport], spec: FitSpec, epoch: int
    ) -> None:
        self.run_epoch, self.spec, self.epoch = run_epoch, spec, epoch

    def attempt(self, attempt: Attempt) -> WorkerReport:
        return self.run_epoch(
            replace(self.spec, fault=self.spec.fault if attempt.restart == 0 else None), attempt
        )

    def restart_point(self) -> str:
        return f"the start of epoch {self.epoch + 1}"


def fit_epochs(
    spec: FitSpec,
    source: Any,
    job: JobConfig,
    controller: Controller[WorkerReport],
    spark: Any,
    checkpoint: CheckpointPolicy | None,
    stop_requested: Callable[[], bool] = lambda: False,
) -> WorkerReport:
    """Train ``spec.epochs`` epochs of ``source`` (a ``spark.dataframe.DataFrameSource``), one
    stage per epoch, each under ``controller``; rank 0's merged report. A spec resumed from a
    checkpoint (``spec.part``) starts at its epoch; ``checkpoint`` saves every epoch's state;
    ``stop_requested()`` True after an epoch's stage: no further stage."""
    from ...spark.dataframe import epoch_stage

    source.prepare(controller.requested, spec.epochs)
    merged: WorkerReport | None = None
    opt_state = spec.part.optimizer_state
    first, last = spec.part.start_epoch, spec.last_epoch()
    before = spec.part.history
    spec = replace(spec, strategy=copy.deepcopy(spec.strategy))  # the caller's object is not advanced
    fault = fault_from_env()  # fires once per job: in the first epoch's first attempt that reaches it

    def run_epoch(stage: FitSpec, attempt: Attempt) -> WorkerReport:
        return epoch_stage(
            stage,
            source,
            workers=attempt.workers,
            spark=spark,
            threads=job.scaling.threads,
            pg_timeout_s=job.failures.pg_timeout_s,
            start_timeout_s=job.failures.start_timeout_s,
            restarts=(attempt.restart, job.failures.max_restarts),
        )

    for epoch in range(first, last + 1):
        controller.workers()  # shrunk by an earlier failure: back to the full count when the slots are
        part = StagePart(
            start_epoch=epoch,
            epochs=1,
            optimizer_state=opt_state,
            return_optimizer_state=True,
            shards=spec.part.shards if epoch == first else None,  # a resumed sharded checkpoint's weights
        )
        restarts_before = controller.restart
        report = controller.run(EpochPlan(run_epoch, replace(spec, part=part, fault=fault), epoch))
        if controller.restart > restarts_before:
            fault = None
        load_model_state(spec.model, state_from_bytes(report.state))  # shipped with the next stage
        opt_state = report.optimizer_state or None
        # the next stage ships the strategy object: its schedule (e.g. the averaging period's
        # position) continues instead of restarting every epoch
        spec.strategy.load_state_dict(report.strategy_state)
        merged = report if merged is None else merged.then(report)
        if checkpoint is not None:
            save_checkpoint(
                checkpoint,
                epoch=epoch + 1,
                step=0,
                model=state_from_bytes(report.state),
                optimizer=opt_state or b"",
                strategy_state=report.strategy_state,
                rng=[],
                history=[*before, *merged.history],
                workers=controller.now,
                model_record=model_record(spec.model),
            )
        if epoch < last and stop_requested():
            # the driver asked the job to stop (a pruned search trial): no further epoch stage
            log.info("the driver asked the job to stop; stopping after epoch %d", epoch + 1)
            break
    assert merged is not None  # fit() checked epochs >= 1
    return merged


__all__ = ["EpochPlan", "Stream", "fit_epochs"]
