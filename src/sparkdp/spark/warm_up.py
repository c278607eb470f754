"""Start the executors' Python worker daemon while the driver does other work, so that the first
training stage forks its workers from a daemon that has already imported torch.

Spark keeps one worker daemon per task environment (the Python function's ``envVars`` plus what
the runner adds), and a DataFrame stage's runner adds variables an RDD job's does not. sparkdp's
stages are DataFrame stages; the warm-up is a one-task RDD job whose function carries the
variables a DataFrame stage's runner would add (:func:`dataframe_worker_env`), so both fork from
the one daemon. An RDD job, not a ``mapInArrow`` one: a DataFrame warm-up job was seen to make a
killed worker's job print the DAGScheduler's accumulator "Connection reset" trace.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

#: the warm-up's thread (it ends with its job, or with the session)
THREAD_NAME = "sparkdp-warm-up"
#: the Spark job group the warm-up's job runs in
JOB_GROUP = "sparkdp-warm-up"

#: what Spark's DataFrame (SQL) Python runners add to a task's environment: the setting that turns
#: each on, its default, and the variable (PySpark 4: BaseArrowPythonRunner / BasePythonRunner)
_DATAFRAME_RUNNER_ENV = (
    ("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled", "true", "SPARK_SIMPLIFIED_TRACEBACK"),
    ("spark.sql.execution.pyspark.udf.hideTraceback.enabled", "false", "SPARK_HIDE_TRACEBACK"),
    ("spark.sql.execution.pyspark.udf.tracebackWithLocals.enabled", "false", "SPARK_TRACEBACK_WITH_LOCALS"),
)


def dataframe_worker_env(conf: Mapping[str, str]) -> dict[str, str]:
    """The variables a DataFrame stage's Python runner adds to its tasks' environment under the
    settings ``conf`` (a session's Spark settings; unset ones take Spark's defaults)."""
    return {
        variable: "1"
        for key, default, variable in _DATAFRAME_RUNNER_ENV
        if str(conf.get(key, default)).strip().lower() == "true"
    }


def start_warm_up(sc: Any) -> None:
    """Run one no-op task in a background thread: it starts the worker daemon that sparkdp's
    DataFrame stages fork their workers from."""
    from .cluster import on_driver_machine

    if not on_driver_machine(sc):
        return  # remote executors may still be arriving; a no-op task would warm only one of them
    job = _warm_up_job(sc)

    def run() -> None:
        try:
            sc.setJobGroup(JOB_GROUP, "sparkdp: start the Python worker daemon", interruptOnCancel=True)
            job.collect()
        except Exception as exc:  # noqa: BLE001 - e.g. the session was stopped meanwhile; nothing is lost
            log.debug("worker warm-up did not finish: %s", exc)

    threading.Thread(target=run, name=THREAD_NAME, daemon=True).start()


def start_planner_warm_up(spark: Any) -> None:
    """In a background thread, plan (never run: no task) a DataFrame stage of sparkdp's kind: the
    JVM's first DataFrame query loads and compiles its planner's code, seconds the first training
    stage would otherwise wait for."""

    def run() -> None:
        try:
            stage = spark.range(2, numPartitions=2).mapInArrow(_pass_batches, "id long", barrier=True)
            stage._jdf.queryExecution().executedPlan()
        except Exception as exc:  # noqa: BLE001 - e.g. the session was stopped meanwhile; nothing is lost
            log.debug("query planner warm-up did not finish: %s", exc)

    threading.Thread(target=run, name=THREAD_NAME, daemon=True).start()


def _warm_up_job(sc: Any) -> Any:
    """A one-task RDD whose function carries a DataFrame stage's task environment. Spark reads
    the environment when the JVM's function is made (``_jrdd``): it is made here, in the thread
    that built the context, so no other function of this session is made with these variables."""
    environment = sc.environment
    before = dict(environment)
    environment.update(dataframe_worker_env(dict(sc.getConf().getAll())))
    try:
        job = sc.parallelize([0], 1).mapPartitions(_no_rows)
        job._jrdd  # noqa: B018 - made now, with the environment above
    finally:
        environment.clear()
        environment.update(before)
    return job


def _no_rows(_rows: Iterator[Any]) -> Iterator[Any]:
    return iter(())


def warm_up_connect(spark: Any) -> None:
    """A Spark Connect session's warm-up: one no-op ``mapInArrow`` task (its functions are made
    on the server, so the environment is a DataFrame stage's already)."""
    try:
        spark.range(1, numPartitions=1).mapInArrow(_pass_batches, "id long").collect()
    except Exception as exc:  # noqa: BLE001 - e.g. the session was stopped meanwhile; nothing is lost
        log.debug("worker warm-up did not finish: %s", exc)


def _pass_batches(batches):
    yield from batches


__all__ = [
    "JOB_GROUP",
    "THREAD_NAME",
    "dataframe_worker_env",
    "start_planner_warm_up",
    "start_warm_up",
    "warm_up_connect",
]
