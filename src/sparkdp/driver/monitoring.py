"""Live monitoring around a job on the driver: the hub starts before the Spark stage and its
link travels to the workers inside the job (``sparkdp.monitor``)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..config import JobConfig
from ..monitor.hub import MonitorHub
from ..strategies.base import Strategy
from ..train.stop import StopNotice

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
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[MonitorHub | None]:
    """The job's :class:`MonitorHub`, or None when nothing would show or keep its records
    (``show_progress=False`` and no run directory, TensorBoard or MLflow): then the workers
    are not monitored at all. When the job's ``strategy`` encrypts its traffic, the monitoring
    connections are encrypted too. ``unreachable`` (why executors cannot connect to this
    process) turns live monitoring off with one line: the job's results still come back
    through its Spark stage. ``on_epoch`` is called with each epoch's results as they arrive
    (the hub then runs even when nothing is shown or kept)."""
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


@contextlib.contextmanager
def epoch_listener(
    on_epoch: Callable[[dict[str, Any]], bool | None] | None, job: JobConfig, spark: Any
) -> Iterator[tuple[Callable[[dict[str, Any]], None] | None, StopNotice | None]]:
    """``on_epoch`` as the hub's listener, and the :class:`StopNotice` it posts when it returns True.

    The notice is a file in a temporary directory where every executor runs on this machine,
    else beside the job's checkpoints (the one place driver and workers share). With neither it
    is a driver-local file the workers do not read (``shared=False``): a streamed DataFrame's
    job still stops between its epoch stages, any other job asked to stop runs to its end."""
    if on_epoch is None:
        yield None, None
        return
    from ..spark.cluster import on_driver_machine

    with contextlib.ExitStack() as stack:
        name = f".stop-{uuid.uuid4().hex}"
        if job.checkpoints.checkpoint_dir is not None and not on_driver_machine(spark):
            base = str(job.checkpoints.checkpoint_dir).rstrip("/")
            notice = StopNotice(f"{base}/{name}", dict(job.checkpoints.checkpoint_storage_options or {}))
            stack.callback(notice.clear)
        else:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="sparkdp-stop-"))
            notice = StopNotice(str(Path(folder) / name), shared=on_driver_machine(spark))

        def listener(record: dict[str, Any]) -> None:
            if on_epoch(record):
                notice.post()

        yield listener, notice
