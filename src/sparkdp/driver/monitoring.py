"""Live monitoring around a job on the driver: the hub starts before the Spark stage and its
link travels to the workers inside the job (``sparkdp.monitor``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..config import JobConfig
from ..monitor.hub import MonitorHub
from ..strategies.base import Strategy

log = logging.getLogger(__name__)


def wants_monitoring(job: JobConfig) -> bool:
    """Whether anything would show or keep the job's live records."""
    return bool(job.monitor.show_progress or job.monitor.run_dir or job.monitor.mlflow)


@contextlib.contextmanager
def monitored(
    job: JobConfig,
    spark: Any,
    workers: int,
    title: str,
    details: dict[str, Any] | None = None,
    strategy: Strategy | None = None,
    unreachable: str | None = None,
    on_epoch: Callable[[dict[str, Any]], bool | None] | None = None,
) -> Iterator[MonitorHub | None]:
    """The job's :class:`MonitorHub`, or None when nothing would show or keep its records
    (``show_progress=False`` and no run directory, TensorBoard or MLflow): then the workers
    are not monitored at all. When the job's ``strategy`` encrypts its traffic, the monitoring
    connections are encrypted too. ``unreachable`` (why executors cannot connect to this
    process) turns live monitoring off with one line: the job's results still come back
    through its Spark stage. ``on_epoch`` is called with each epoch's results as they arrive
    (the hub then runs even when nothing is shown or kept); True asks the job to stop."""
    if not wants_monitoring(job) and on_epoch is None:
        yield None
        return
    if unreachable:
        log.warning(
            "sparkdp: live monitoring is off, the executors cannot send it to this process (%s); each "
            "epoch's results come back with the job when it ends",
            unreachable,
        )
        yield None
        return
    from ..spark.cluster import driver_host

    config = {**job.settings(), **(details or {}), "workers": workers}
    with MonitorHub(
        world_size=workers,
        config=config,
        run_dir=job.monitor.run_dir,
        display=job.monitor.show_progress,
        tensorboard=job.monitor.tensorboard,
        mlflow=job.monitor.mlflow,
        mlflow_run_id=job.monitor.mlflow_run_id,
        interval_s=job.monitor.metrics_interval_s,
        host=driver_host(spark),
        title=title,
        tls=getattr(strategy, "tls", False),
        comm_is_own=getattr(strategy, "comm_is_own", False),
        on_epoch=on_epoch,
    ) as hub:
        yield hub
