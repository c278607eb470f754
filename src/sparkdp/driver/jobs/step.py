"""The step kind: a synchronous job with per-step fault tolerance (``fault_tolerance="step"``).

Each worker slot is its own one-task Spark job (ordinary, not barrier: a barrier stage would
end every task when one fails), started from a thread of this process. The workers form a
quorum kept here (``driver.quorum``, over ``driver.quorum_server``'s authenticated endpoint);
a lost worker is dropped at the next step boundary and the others continue without a restart.
Its replacement comes from Spark's task retries (``spark.task.maxFailures``; ``local[N,F]`` on
one machine, as sessions sparkdp starts are) and, once those are spent, from this driver
submitting the slot again (at most ``max_restarts`` times per slot); it heals from a live
peer at a step boundary. The whole run is one attempt of the job's controller, so ``restarts``
stays empty; the leaves and joins are the result's ``membership``. When no member is left to
heal from, the job fails as a lost stage does.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ...config import JobConfig
from ...data.base import WorkerData
from ...errors import ConfigError, WorkerFailed
from ...monitor.hub import MonitorHub
from ...strategies.base import Strategy
from ...train.faults import Fault, fault_from_env
from ...train.loop import FitSpec
from ...train.report import WorkerReport
from ...train.result import TrainResult
from ...train.row_cursor import RowCursor
from ...train.step_diloco import DiLoCoRounds
from ...train.step_hsdp import HSDPSteps
from ...train.step_worker import StepLink, StepTrainer, fit_step_worker
from ..controller import Attempt
from ..quorum import Quorum
from ..quorum_server import QuorumServer
from ..step_recovery import StepStart, addressable_data, step_start
from .barrier import trained
from .base import Body, JobRun

log = logging.getLogger(__name__)

#: the strategies this kind runs, with the trainer of each (a quorum step: a step, an outer round)
TRAINERS: dict[str, type[StepTrainer]] = {"allreduce": StepTrainer, "diloco": DiLoCoRounds, "hsdp": HSDPSteps}
COVERED = tuple(TRAINERS)
#: a lost worker is dropped after this long without a frame (it sends one a second)
HEARTBEAT_TIMEOUT_S = 5.0


class StepFaultTolerant:
    """Synchronous workers in a quorum kept by the driver: a lost one is dropped at the next step
    boundary and replaced by a task that heals from a live peer."""

    label = "Spark workers (per-step fault tolerance)"

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        refuse_unsupported(spec, run.job, run.workers)
        with addressable_data(spec, run.spark) as spec, step_start(run.job) as start:
            plan = QuorumPlan(spec, run, start)
            controller = run.controller()
            report = controller.run(plan)
        result = trained(report, spec, run.workers, spec.epochs, run.started, controller)
        result.details["membership"] = list(plan.membership)
        return result

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        raise ConfigError(
            "fault_tolerance='step' applies to sparkdp.fit; sparkdp.run and launch run your own loop, "
            "which restarts from its checkpoints (fault_tolerance='restart')."
        )


def refuse_unsupported(spec: FitSpec, job: JobConfig, workers: int) -> None:
    """One clear line for what per-step fault tolerance does not cover (yet)."""
    training, name = spec.training, spec.strategy.name
    problems = []
    if name not in COVERED:
        problems.append(f"strategy {name!r} (covered: {', '.join(COVERED)})")
    options = spec.strategy.options()
    if name == "hsdp":
        problems.extend(hsdp_problems(options, workers))
        if job.checkpoints.checkpoint_dir is not None or job.checkpoints.resume is not None:
            problems.append(
                "hsdp's checkpoints in this mode (its workers hold shards: a replacement heals from a "
                "live group instead; restart mode writes sharded checkpoints)"
            )
    if options.get("compression", "none") != "none":
        problems.append(f"{name}'s compression (the quorum sums float32 tensors)")
    if options.get("fragments", 1) != 1 or options.get("overlap_steps", 0) != 0:
        problems.append("diloco's fragments and overlap_steps (a round syncs the whole model at its end)")
    streamed = not isinstance(spec.train, WorkerData)  # a DataFrame, written to Parquet once
    if not streamed and not callable(getattr(spec.train, "rows_at", None)):
        problems.append(
            f"data {spec.train.describe()} (covered: in-memory arrays, tensors and datasets, Parquet, DataFrames)"
        )
    if getattr(getattr(spec.train, "converter", None), "drop_nulls", False):
        problems.append("drop_nulls (the row cursor trains every row; filter nulls out of the data first)")
    if training.accumulate != 1 or training.precision != "32" or training.clip_grad_norm is not None:
        problems.append("accumulate, mixed precision or clip_grad_norm")
    if problems:
        raise ConfigError(
            f"fault_tolerance='step' does not cover {'; '.join(problems)}. Use fault_tolerance='restart' "
            "for this job, or change these settings."
        )


def hsdp_problems(options: dict[str, Any], workers: int) -> list[str]:
    """What hsdp's settings need in step mode: replica groups of ``shard_size`` workers, at least
    two (a group that loses a worker heals from another), float32 shards and gradients."""
    shard = options.get("shard_size")
    if shard is None:
        return [
            "hsdp without shard_size (set strategy_options={'shard_size': k}: the workers of one "
            "replica group, whichever hosts Spark places them on)"
        ]
    problems = []
    if workers % shard or workers // shard < 2:
        problems.append(
            f"hsdp's shard_size={shard} with {workers} workers (it must divide the workers into at "
            "least 2 replica groups: a group that loses a worker heals from another)"
        )
    if options.get("param_dtype") is not None or options.get("reduce_dtype") != "fp32":
        problems.append("hsdp's param_dtype or reduce_dtype (the quorum sums float32 gradient shards)")
    return problems


def replica_size(spec: FitSpec) -> int:
    """The workers of one replica group, the quorum's unit of membership (hsdp: its shard groups)."""
    return int(spec.strategy.options().get("shard_size") or 1) if spec.strategy.name == "hsdp" else 1


@dataclass
class QuorumPlan:
    """The job's one attempt: every slot's task, the quorum, and the leaves and joins."""

    spec: FitSpec
    run: JobRun
    #: the checkpoint each attempt starts from, and where the quorum's rank 0 saves
    start: StepStart = field(default_factory=lambda: StepStart(None, None))
    membership: list[dict[str, Any]] = field(default_factory=list)
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)
    #: set once the job is over: a slot's task still running is cancelled, not replaced
    over: threading.Event = field(default_factory=threading.Event)
    #: per slot: cancel its task (the job is over, or the worker went silent)
    cancels: dict[int, threading.Event] = field(default_factory=dict)

    def restart_point(self) -> str | None:
        # a quorum that cannot go on restarts from the newest checkpoint; without any, fails the job
        return self.start.restart_point()

    def attempt(self, attempt: Attempt) -> WorkerReport:
        from ...spark.cluster import driver_host
        from ...spark.task import listening_store

        spark, workers, failures = self.run.spark, self.run.workers, self.run.job.failures
        host = driver_host(spark)
        cursor = TRAINERS[self.spec.strategy.name].cursor_for(self.spec, workers)
        step, state = self.start.state(attempt.restart, cursor, self.spec.train)
        quorum = Quorum(workers, cursor.total_steps, replica_size(self.spec), step=step)
        self.results, self.errors = {}, {}
        progress = QuorumProgress(self.run.hub, cursor, quorum)
        store = listening_store(host, workers)
        self.cancels = {w: threading.Event() for w in range(workers)}

        def heard(record: dict[str, Any]) -> None:
            progress.membership(record)
            self.heard(record)

        with QuorumServer(quorum, host, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, on_record=heard) as server:
            link = StepLink(
                server.info,
                (host, store.port),
                workers,
                self.run.job.scaling.threads,
                failures.pg_timeout_s,
                wait_s=failures.start_timeout_s + failures.pg_timeout_s,
                start=state,
            )
            spec = replace(self.spec, fault=None, checkpoint=self.start.policy, monitor=None)
            fault = fault_from_env() if attempt.restart == 0 else None  # the first attempt's only
            threads = [
                threading.Thread(
                    target=self.slot, args=(w, spec, link, fault), name=f"sparkdp-slot-{w}", daemon=True
                )
                for w in range(workers)
            ]
            for thread in threads:
                thread.start()

            def finished() -> bool:
                reported = quorum.done and any(isinstance(r, WorkerReport) for r in self.results.values())
                return reported or quorum.failed is not None or bool(self.errors)

            while not finished() and any(t.is_alive() for t in threads):
                server.wait(finished, 0.5)
                progress.tell()
            progress.tell(final=True)
            self.over.set()  # a task still running (a silent worker's) is cancelled
            for event in self.cancels.values():
                event.set()
            for thread in threads:
                thread.join(timeout=60)
            self.membership += quorum.records
        del store
        return self.outcome(quorum)

    def outcome(self, quorum: Quorum) -> WorkerReport:
        """The final quorum's report, or the error that ended the job."""
        if self.errors:
            raise next(iter(self.errors.values()))
        if quorum.failed is not None:
            raise WorkerFailed(f"the quorum cannot go on: {quorum.failed}")
        reports = [r for r in self.results.values() if isinstance(r, WorkerReport)]
        if not reports:
            raise WorkerFailed("no worker of the final quorum returned the job's report.")
        return reports[0]

    def heard(self, record: dict[str, Any]) -> None:
        """A leave or join: its console line; a worker gone silent (its process alive, stopped or
        hung, so Spark would never retry it) has its task cancelled and a replacement submitted."""
        announce(record)
        if record["kind"] == "leave" and "heartbeat" in record["cause"]:
            self.cancels[record["worker"]].set()

    def slot(self, worker: int, spec: FitSpec, link: StepLink, fault: Fault | None) -> None:
        """Slot ``worker``'s task until it returns; a task that failed for good is submitted again."""
        from ...spark.launcher import JobCancelled, run_tasks

        for incarnation in range(self.run.job.failures.max_restarts + 1):
            self.cancels[worker].clear()
            try:
                [self.results[worker]] = run_tasks(
                    slot_task(spec, link, worker, incarnation, fault),
                    1,
                    spark=self.run.spark,
                    description=f"sparkdp {spec.strategy.name} worker {worker} (per-step fault tolerance)",
                    start_timeout_s=self.run.job.failures.start_timeout_s,
                    what=f"worker {worker}",
                    cancel=self.cancels[worker],
                )
                return
            except (WorkerFailed, JobCancelled) as exc:  # its process or executor was lost: a replacement
                if self.over.is_set():
                    return
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning("sparkdp: worker %d's task ended (%s); starting a replacement", worker, first)
            except BaseException as exc:  # bad settings or data: the same would fail again
                self.errors[worker] = exc
                return
        self.errors[worker] = WorkerFailed(
            f"worker {worker}'s task failed {self.run.job.failures.max_restarts + 1} times; raise max_restarts."
        )


@dataclass
class QuorumProgress:
    """The live monitor's view of the quorum (this kind's workers report nothing to it): the
    committed steps and rows every ``hub.interval_s``, and the quorum's size at each leave and join."""

    hub: MonitorHub | None
    cursor: RowCursor
    quorum: Quorum
    told: float = float("-inf")

    def tell(self, final: bool = False) -> None:
        """The quorum's progress, at most once an interval (``final``: now, the job's last figures)."""
        now = time.monotonic()
        if self.hub is None or (not final and now - self.told < self.hub.interval_s):
            return
        self.told, steps = now, self.quorum.step
        progress = {
            "steps": steps,
            "samples": self.cursor.rows_before(steps),
            "quorum": len(self.quorum.members),
            "workers": self.quorum.workers,
            "total_steps": self.cursor.total_steps,
            "steps_per_epoch": self.cursor.steps_per_epoch,
            "epochs": self.cursor.epochs,
        }
        try:
            self.hub.quorum_progress(progress)
        except Exception:  # monitoring must not fail the job
            log.warning("sparkdp: the monitor could not take the quorum's progress", exc_info=True)

    def membership(self, record: dict[str, Any]) -> None:
        """A leave or join, and the quorum's size after it (called under the quorum server's lock,
        so the members are those the record left)."""
        if self.hub is None:
            return
        try:
            self.hub.membership(record, len(self.quorum.members))
        except Exception:  # monitoring must not fail the job (nor the quorum's connection)
            log.warning("sparkdp: the monitor could not take a leave or join", exc_info=True)


def slot_task(spec: FitSpec, link: StepLink, worker: int, incarnation: int, fault: Fault | None) -> Any:
    """What slot ``worker``'s Spark task runs; a retried task (Spark's, or the driver's
    ``incarnation`` > 0) joins as a replacement, and only the first ever sees the injected fault."""

    def body(_index: int) -> Any:
        from ...spark.task import task_attempt

        joining = incarnation > 0 or task_attempt() > 0
        trainer = TRAINERS[spec.strategy.name]
        return fit_step_worker(
            spec, link, worker, joining=joining, fault=None if joining else fault, trainer_class=trainer
        )

    return body


def announce(record: dict[str, Any]) -> None:
    """One console line per leave and per join."""
    if record["kind"] == "leave":
        log.warning(
            "sparkdp: worker %d left the quorum at step %d (%s)",
            record["worker"],
            record["step"],
            record["cause"],
        )
    elif record.get("heal_s") is None:
        log.warning(
            "sparkdp: worker %d could not join at step %d: its healer was lost",
            record["worker"],
            record["step"],
        )
    else:
        log.warning(
            "sparkdp: worker %d joined the quorum at step %d, healed from worker %d in %.2f s (%d bytes)",
            record["worker"],
            record["step"],
            record["healed_from"],
            record["heal_s"],
            record["bytes"],
        )


__all__ = ["COVERED", "TRAINERS", "QuorumPlan", "QuorumProgress", "StepFaultTolerant", "refuse_unsupported"]
