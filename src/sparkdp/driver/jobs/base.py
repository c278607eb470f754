"""What every job kind shares: the :class:`JobKind` protocol, the job's run (:class:`JobRun`)
and the one place the job's controller and its restart policy are built (:meth:`JobRun.controller`).

A kind owns, for its way of running, where an attempt starts (its resume point and lineage,
refusing another job's checkpoints), its checkpoint writer (through the job's
:class:`~sparkdp.train.checkpoint_manager.CheckpointManager`), the attempt itself and the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...comm.base import Collective
from ...config import JobConfig
from ...monitor.hub import MonitorHub
from ...strategies.base import Strategy
from ...train.loop import FitSpec
from ...train.result import TrainResult
from ..controller import Attempt, Controller, RestartPolicy, ScalingPolicy

#: what ``sparkdp.run`` runs on every worker: ``body(collective, strategy, attempt)``
Body = Callable[[Collective, Strategy, Attempt], Any]


@dataclass(frozen=True)
class JobRun:
    """One job on Spark: its settings, the workers it asks for, the session, the live monitor
    (None when nothing watches) and when it started (``time.perf_counter()``)."""

    job: JobConfig
    workers: int
    spark: Any
    hub: MonitorHub | None = None
    started: float = 0.0

    def controller(self, slots: Callable[[], int | None] = lambda: None) -> Controller[Any]:
        """The job's controller: the job's failure policy (``max_restarts``), its scaling policy
        (``min_workers`` over ``slots()``, the task slots its workers may use now), and the live
        monitor told of every restart. The one place each is built, so every kind restarts and
        shrinks alike."""
        return Controller(
            RestartPolicy.of(self.job),
            ScalingPolicy.of(self.job, self.workers, slots),
            callbacks=(self.hub,) if self.hub is not None else (),
        )


class JobKind(Protocol):
    """One way a job's workers run on Spark, chosen once where the job starts
    (:func:`sparkdp.driver.jobs.kind_for`)."""

    #: what the progress line calls the workers
    label: str

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        """Train ``spec`` (``spec.model`` ends up trained) and return the job's result."""
        ...

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        """Run ``body(collective, strategy, attempt)`` on every worker (``sparkdp.run``), restarted
        from the start as the job's restart policy allows; rank 0's result."""
        ...


__all__ = ["Body", "JobKind", "JobRun"]
