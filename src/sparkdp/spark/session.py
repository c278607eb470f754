"""The Spark session sparkdp runs on: embedded ``local[N]`` by default, any master on request."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from .environment import check_java, check_master_reachable

log = logging.getLogger(__name__)

_LOG4J = Path(__file__).with_name("log4j2.properties")

# Settings sparkdp needs for its barrier jobs; a user's own conf wins over these.
_DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # A barrier stage asking for more slots than exist is retried 40 times, 15 s apart,
    # before Spark gives up; the launcher checks slots itself and cancels on its own timeout.
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2s",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # A fresh worker per task (forked from the torch-preloaded daemon, so cheap): reused workers
    # were seen to desynchronise from the JVM after barrier stages and hang the next job.
    "spark.python.worker.reuse": "false",
    # workers fork from a daemon that has already imported torch (see sparkdp.spark.daemon)
    "spark.python.daemon.module": "sparkdp.spark.daemon",
}


def _set_python_env() -> None:
    """Make executors start this interpreter: without it they run the system python
    and fail with "No module named torch" (the classic newcomer trap)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def default_master() -> str:
    return f"local[{os.cpu_count() or 1}]"


def session(master: str | None = None, *, app_name: str = "sparkdp", conf: Mapping[str, str] | None = None):
    """Return the SparkSession to train on.

    Args:
        master: a Spark master URL (``local[N]``, ``spark://host:port``, ``yarn``,
            ``k8s://...``). ``None`` reuses an active session if there is one,
            otherwise starts an embedded ``local[N]`` session with N = CPU cores.
        app_name: the application name shown by the cluster manager.
        conf: extra Spark settings; they override sparkdp's defaults.

    Example:
        >>> spark = sparkdp.session()            # doctest: +SKIP
        >>> spark.sparkContext.master            # doctest: +SKIP
        'local[2]'
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and (master is None or active.sparkContext.master == master):
        return active
    check_java()
    master = master or default_master()
    check_master_reachable(master)
    _set_python_env()
    settings = dict(_DEFAULT_CONF)
    settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    settings["spark.pyspark.driver.python"] = os.environ["PYSPARK_DRIVER_PYTHON"]
    settings["spark.executorEnv.PYSPARK_PYTHON"] = os.environ["PYSPARK_PYTHON"]
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}"
    if master.startswith("local"):
        # Everything stays on loopback; the hostname may resolve to a non-loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    log.info("starting Spark (%s)", master)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
