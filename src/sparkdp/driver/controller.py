"""The one job controller: start an attempt, collect its outcome, restart or give up.

Every way in (``fit``, ``run``, ``launch``, ``sparkdp train``) and every plan (a barrier stage,
a streamed DataFrame's epoch stages, a parameter server on the driver or on the executors)
runs its workers through :meth:`Controller.run`. An attempt ends in one of three ways:

* it returns: the job (or this part of it) is done;
* it raises :class:`~sparkdp.errors.WorkerFailed` (a worker died, hung or lost its executor):
  the failure policy (:class:`RestartPolicy`) decides whether a restart is allowed, the scaling
  policy (:class:`ScalingPolicy`) on how many workers, the plan says where the next attempt
  continues from (its newest checkpoint), and the next attempt starts there;
* it raises :class:`~sparkdp.errors.WorkerPreempted` (a worker was asked to stop: every rank
  saved at the step they agreed on): the next attempt continues from that checkpoint, on the
  slots left, and the preemption does not count against ``max_restarts`` -- the job lost no
  work, and a cluster that reclaims machines would otherwise end long jobs. A preemption that
  made no progress since the previous one (its checkpoint is at the same place) counts as a
  failure, so that a worker stopped at every start cannot restart the job forever;
* it raises anything else (bad configuration or data, a diverged loss), or a worker ran out of
  memory (:class:`~sparkdp.errors.WorkerOutOfMemory`): raised at once, since running it again
  would fail the same way.

Each failure or preemption is one warning line and each recovery another, with the same wording
for every plan (docs/guide/reliability.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ..config import JobConfig
from ..errors import WorkerFailed, WorkerHung, WorkerOutOfMemory, WorkerPreempted

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Attempt:
    """One try of a job's workers: ``restart`` 0 is the first, n the n-th restart (what a
    launched script reads as ``TORCHELASTIC_RESTART_COUNT``); ``workers`` it runs on."""

    restart: int
    workers: int


class Plan(Protocol[T_co]):
    """How one launch kind runs an attempt and where a restart of it continues from."""

    def attempt(self, attempt: Attempt) -> T_co:
        """Run ``attempt`` to its end; a restart (``attempt.restart > 0``) first loads the state
        :meth:`restart_point` found. Raises ``WorkerFailed`` when a worker is lost."""
        ...

    def restart_point(self) -> str | None:
        """After a failed attempt: where the next attempt would continue from, for the log line;
        None when this plan cannot restart (no checkpoints). It only looks: the next attempt
        finds and loads that state itself."""
        ...


@dataclass(frozen=True)
class ScalingPolicy:
    """On how many workers an attempt runs: the ``requested`` count while the task slots are
    there (or unknown); after a failure that took slots away, as many as ``slots()`` says are free
    now, down to ``min_workers`` (None: always the full count, waiting for the slots); back to the
    full count when they return."""

    requested: int
    min_workers: int | None = None
    slots: Callable[[], int | None] = lambda: None

    @classmethod
    def of(cls, job: JobConfig, requested: int, slots: Callable[[], int | None]) -> ScalingPolicy:
        return cls(requested, job.failures.min_workers, slots)

    def workers(self) -> int:
        """All requested workers if the slots are there (or unknown); else as many as fit, down to
        ``min_workers`` (below it, the stage waits for slots and fails after start_timeout_s)."""
        free = self.slots()
        if self.min_workers is None or free is None or free >= self.requested:
            return self.requested
        return max(self.min_workers, free)

    def shrunk(self, now: int) -> str:
        """The end of a restart's log line when it runs on fewer workers than requested."""
        return f" on {now} of {self.requested} workers (task slots gone)" if now < self.requested else ""


@dataclass
class RestartPolicy:
    """Whether a failed job continues: the failure policy of every plan.

    ``max_restarts`` failures are recovered over the whole job (preemptions that made progress
    are not counted); the :class:`ScalingPolicy` passed in says on how many workers. Each failure
    is one warning line: its cause, the restart's number, where it continues from and on how many
    workers."""

    max_restarts: int
    pg_timeout_s: float = 60.0
    #: one record per failure: its cause, where the job continued from, on how many workers, and
    #: how long the failed attempt had run (its work after the checkpoint resumed from was redone)
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: one record per preemption (not counted against max_restarts): its cause and where it resumed
    preemptions: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, job: JobConfig) -> RestartPolicy:
        return cls(job.failures.max_restarts, job.failures.pg_timeout_s)

    def recover(
        self,
        exc: WorkerFailed,
        scaling: ScalingPolicy,
        where: str,
        can_restart: bool = True,
        attempt_s: float = 0.0,
    ) -> int:
        """After ``exc`` (in an attempt that ran ``attempt_s`` seconds): the workers to continue
        on (``scaling``'s choice), with the one log line; raises when the failures are more than ``max_restarts`` (or
        ``can_restart`` is False). A worker out of memory is not restarted: the same settings would
        run out again."""
        cause = self.cause(exc)
        self.failures.append({"cause": cause, "restart_from": where, "attempt_s": attempt_s})
        if isinstance(exc, WorkerOutOfMemory):  # its own line, even after failures recovered earlier
            raise exc
        if not can_restart or len(self.failures) > self.max_restarts:
            if len(self.failures) == 1:
                raise exc
            listed = "; ".join(f"{i + 1}: {f['cause']}" for i, f in enumerate(self.failures))
            raise WorkerFailed(
                f"the job failed {len(self.failures)} times, more than max_restarts="
                f"{self.max_restarts} allows ({listed}). Fix the cause, or raise "
                "max_restarts."
            ) from exc
        now = scaling.workers()
        self.failures[-1]["workers"] = now
        log.warning(
            "sparkdp: %s -- restart %d of %d from %s%s",
            cause,
            len(self.failures),
            self.max_restarts,
            where,
            scaling.shrunk(now),
        )
        return now

    def preempted(
        self, exc: WorkerPreempted, scaling: ScalingPolicy, where: str, attempt_s: float = 0.0
    ) -> int:
        """After a preemption that saved at ``where``: the workers to continue on, with the one log
        line; not counted against ``max_restarts`` unless it made no progress since the previous
        preemption (then :meth:`recover` decides, as for any failure)."""
        if self.preemptions and self.preemptions[-1]["restart_from"] == where:
            return self.recover(exc, scaling, where, attempt_s=attempt_s)
        cause = self.cause(exc)
        now = scaling.workers()
        self.preemptions.append(
            {"cause": cause, "restart_from": where, "attempt_s": attempt_s, "workers": now}
        )
        log.warning(
            "sparkdp: %s -- preemption %d, restart from %s%s (preemptions do not count against max_restarts)",
            cause,
            len(self.preemptions),
            where,
            scaling.shrunk(now),
        )
        return now

    def recovered(self, workers: int, requested: int, preemption: bool = False) -> None:
        """The one line once the attempt after a failure (or a preemption) has done its work."""
        kind, records = ("preemption", self.preemptions) if preemption else ("failure", self.failures)
        log.warning(
            "sparkdp: recovered from %s %d (%s) on %d of %d workers",
            kind,
            len(records),
            records[-1]["cause"],
            workers,
            requested,
        )

    def cause(self, exc: WorkerFailed) -> str:
        """One line for the log: what failed, where."""
        first = str(exc).strip().splitlines()[0]
        if isinstance(exc, WorkerHung):  # the stalled worker, named by the one that waited (train.loop)
            return f"{first} (after {self.pg_timeout_s:g} s)"
        return first


class ControllerCallback(Protocol):
    """Told of every restart the controller decides: the live monitor's run log keeps them."""

    def on_restart(self, kind: str, record: dict[str, Any]) -> None:
        """``kind`` "failure" or "preemption"; ``record`` its cause, where the job continues from,
        on how many workers, and how long the attempt had run."""
        ...


class Controller(Generic[T]):
    """Runs a plan's attempts for the whole job under two policies passed in: the failure policy
    (:class:`RestartPolicy`: whether a failed attempt is tried again) and the scaling policy
    (:class:`ScalingPolicy`: on how many workers, read after a failure to shrink the next attempt
    and by :meth:`workers` to grow back). A plan that runs in parts (a streamed DataFrame: one
    stage per epoch) calls :meth:`run` once per part; the failures count over all of them.
    ``callbacks`` hear of every restart."""

    def __init__(
        self,
        restarts: RestartPolicy,
        scaling: ScalingPolicy,
        callbacks: Sequence[ControllerCallback] = (),
    ) -> None:
        self.restarts, self.scaling = restarts, scaling
        self.requested = scaling.requested
        self.callbacks = tuple(callbacks)
        self.now = scaling.requested  # the workers the next attempt runs on
        self.restart = 0  # restarts so far

    def record(self, details: dict[str, Any]) -> dict[str, Any]:
        """``details`` of a job's result with the failures recovered on the way (``restarts``) and
        the preemptions (restarts that saved first, not counted against max_restarts): the one
        place every kind's result gets them."""
        details["restarts"] = list(self.restarts.failures)
        details["preemptions"] = list(self.restarts.preemptions)
        return details

    def _told(self, preempted: bool) -> None:
        kind, records = (
            ("preemption", self.restarts.preemptions) if preempted else ("failure", self.restarts.failures)
        )
        for callback in self.callbacks:
            callback.on_restart(kind, dict(records[-1]))

    def workers(self) -> int:
        """The workers the next part runs on: back to the full count once the slots return."""
        if self.now < self.requested:
            self.now = self.scaling.workers()
        return self.now

    def run(self, plan: Plan[T]) -> T:
        """Run ``plan``'s attempts until one returns; each failure is decided by the policy."""
        failed, preempted = False, False
        while True:
            began = time.perf_counter()
            try:
                result = plan.attempt(Attempt(self.restart, self.now))
            except WorkerPreempted as exc:
                where = plan.restart_point()
                if where is None:  # nowhere to continue from: a failure like any other
                    self.restarts.recover(exc, self.scaling, "nowhere", can_restart=False)
                assert where is not None  # (recover raised)
                counted = len(self.restarts.failures)
                self.now = self.restarts.preempted(
                    exc, self.scaling, where, attempt_s=time.perf_counter() - began
                )
                preempted = len(self.restarts.failures) == counted
                self.restart, failed = self.restart + 1, failed or not preempted
                self._told(preempted)
                continue
            except WorkerFailed as exc:
                where = plan.restart_point()
                self.now = self.restarts.recover(
                    exc,
                    self.scaling,
                    where or "nowhere",
                    can_restart=where is not None,
                    attempt_s=time.perf_counter() - began,
                )
                self.restart, failed, preempted = self.restart + 1, True, False
                self._told(False)
                continue
            if failed or preempted:
                self.restarts.recovered(self.now, self.requested, preemption=preempted)
            return result


__all__ = ["Attempt", "Controller", "ControllerCallback", "Plan", "RestartPolicy", "ScalingPolicy"]
