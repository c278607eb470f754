"""Executors Spark is decommissioning, as the driver sees them (classic sessions).

With ``spark.decommission.enabled=true``, a standalone Worker that receives SIGPWR (or that the
Master decommissions), a Kubernetes pod being deleted, or dynamic allocation releasing an
executor marks the executor decommissioning: it takes no new tasks and exits once its running
tasks end. Nothing reaches the tasks' Python processes, so a training stage would run on until
the machine went away. The driver's task scheduler knows, though: :func:`decommissioning`
reads it through py4j, and :class:`DecommissionWatch` polls it while a stage runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: how often the driver asks the task scheduler (a py4j call on the driver's own JVM)
POLL_S = 1.0


def decommissioning(spark: Any) -> list[str] | None:
    """The ids of the executors that run tasks now and are decommissioning; None where this
    cannot be known (a Spark Connect session, a scheduler without the state)."""
    from .cluster import is_connect

    if is_connect(spark):
        return None
    sc = spark if hasattr(spark, "_jsc") else spark.sparkContext
    try:
        scheduler = sc._jsc.sc().taskScheduler()
        running = scheduler.runningTasksByExecutors().iterator()
        busy = []
        while running.hasNext():
            pair = running.next()
            if int(pair._2()) > 0:
                busy.append(str(pair._1()))
        return [e for e in busy if scheduler.getExecutorDecommissionState(e).isDefined()]
    except Exception:  # noqa: BLE001 - another scheduler, or py4j could not reach it
        return None


class DecommissionWatch:
    """A thread that calls ``on_decommission(executor_ids)`` once, when an executor running tasks
    starts decommissioning; :meth:`close` stops it."""

    def __init__(self, spark: Any, on_decommission: Callable[[list[str]], None]) -> None:
        self.spark, self.on_decommission = spark, on_decommission
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdp-decommission-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            found = decommissioning(self.spark)
            if found is None:  # this session cannot tell: stop asking
                return
            if found:
                self.on_decommission(found)
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5.0)


__all__ = ["DecommissionWatch", "decommissioning"]
