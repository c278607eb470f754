"""One job kind per way of running, chosen once where the job starts (:func:`kind_for`).

* :class:`~sparkdp.driver.jobs.barrier.Barrier`: one barrier stage (synchronous; in-memory or
  Parquet data), restarted from checkpoints.
* :class:`~sparkdp.driver.jobs.stream.Stream`: a streamed DataFrame, one barrier stage per epoch.
* :class:`~sparkdp.driver.jobs.driver_server.DriverServer`: ordinary tasks around a parameter
  server in this process.
* :class:`~sparkdp.driver.jobs.executor_servers.ExecutorServers`: ``servers=K`` server tasks and
  the workers in one barrier stage.
* :class:`~sparkdp.driver.jobs.step.StepFaultTolerant`: ``fault_tolerance="step"``: one Spark job
  per worker slot around a quorum on the driver; a lost worker is dropped at the next step and
  replaced by one that heals from a live peer.

Every kind runs its attempts through the job's one controller (:meth:`JobRun.controller`), and
writes and resumes its checkpoints through the job's
:class:`~sparkdp.train.checkpoint_manager.CheckpointManager`. This is the one place a strategy's
``Launcher`` and declared servers are read: nothing outside driver/ branches on the kind.
"""

from __future__ import annotations

from typing import cast

from ...errors import ConfigError
from ...strategies.async_ps import AsyncParameterServer
from ...strategies.base import Launcher, Strategy
from .barrier import Barrier
from .base import Body, JobKind, JobRun
from .driver_server import DriverServer
from .executor_servers import ExecutorServers
from .step import StepFaultTolerant
from .stream import Stream


def kind_for(
    strategy: Strategy, streamed: bool, driver_unreachable: bool = False, fault_tolerance: str = "restart"
) -> JobKind:
    """The kind of job ``strategy``'s declared topology runs as, on streamed DataFrame data or
    not. ``driver_unreachable``: the executors cannot connect to this process, so a parameter
    server the strategy leaves on the driver runs as one server task instead (the strategy itself
    is not changed). ``fault_tolerance="step"``: a synchronous job whose workers keep training
    when one is lost (:class:`~sparkdp.driver.jobs.step.StepFaultTolerant`)."""
    if fault_tolerance == "step":
        return step_kind(strategy, driver_unreachable)
    if strategy.launcher is Launcher.TASKS:
        if streamed:
            raise ConfigError(
                f"the asynchronous strategy {strategy.name!r} reads in-memory data or Parquet "
                "files; a DataFrame that is not a plain Parquet scan is supported by the synchronous "
                "strategies. Write it to Parquet and pass the path."
            )
        servers = cast(AsyncParameterServer, strategy).servers  # Launcher.TASKS: this strategy's
        if servers or driver_unreachable:
            return ExecutorServers(servers or 1)
        return DriverServer()
    return Stream() if streamed else Barrier()


def step_kind(strategy: Strategy, driver_unreachable: bool) -> JobKind:
    """The step kind, or one clear line for what it cannot run (a streamed DataFrame it writes to
    Parquet once: ``driver.step_recovery``)."""
    if strategy.launcher is Launcher.TASKS:
        raise ConfigError(
            f"fault_tolerance='step' is for synchronous strategies; {strategy.name!r} is asynchronous, and "
            "its parameter server already keeps training when a worker is lost. Drop fault_tolerance."
        )
    if driver_unreachable:
        raise ConfigError(
            "fault_tolerance='step' keeps its quorum on the driver, and the executors cannot connect to "
            "this process; use fault_tolerance='restart', or run the driver where executors reach it."
        )
    return StepFaultTolerant()


__all__ = [
    "Barrier",
    "Body",
    "DriverServer",
    "ExecutorServers",
    "JobKind",
    "JobRun",
    "StepFaultTolerant",
    "Stream",
    "kind_for",
]
