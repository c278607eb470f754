"""The stream kind: a synchronous job on a streamed Spark DataFrame, one barrier ``mapInArrow``
stage per epoch (driver/streamed.py runs the epochs); the driver holds the state between epochs
and reruns a failed epoch itself."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...strategies.base import Strategy
from ...train.loop import FitSpec
from ...train.result import TrainResult
from ..memory_advice import out_of_memory_explained
from ..recovery import checkpoint_policy, resume_spec
from ..streamed import fit_epochs
from .barrier import trained
from .base import Body, JobRun


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


__all__ = ["Stream"]
