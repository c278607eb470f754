"""The Spark session sparkdp runs on: embedded ``local[N]`` by default, any master on request."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..redact import redact
from . import jvm_archive
from .environment import check_java, check_master_reachable
from .warm_up import THREAD_NAME as WARM_UP_THREAD
from .warm_up import start_planner_warm_up, start_warm_up, warm_up_connect

log = logging.getLogger(__name__)

_LOG4J = Path(__file__).with_name("log4j2.properties")
#: the JVM loggers that print a failed task's stack trace (off in log4j2.properties)
_TASK_FAILURE_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager")
#: log levels that ask for more than errors: with them the task failures' traces are shown
_VERBOSE_LEVELS = ("WARN", "INFO", "DEBUG", "TRACE", "ALL")

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


def driver_java_options() -> str:
    """The driver JVM's options sparkdp sets: its quiet log4j configuration."""
    return f"-Dlog4j2.configurationFile={_LOG4J.as_uri()}"


#: ``session(jit=...)``: the driver JVM's just-in-time compilers. "quick" compiles with C1 only: the
#: session and its first stages start about 2 s sooner on 2 cores, where C2's compiles and C1's
#: profiling code compete with the driver, the workers' start and the data, but code the JVM runs
#: for minutes stays C1's (the epochs of a DataFrame streamed through Spark took 1.46x as long;
#: docs/benchmarks.md, "The JVM's compilers"). "full" is the JVM's own tiered C1 + C2.
JIT_OPTIONS = {"quick": "-XX:TieredStopAtLevel=1", "full": ""}
#: options that choose the compilers themselves: a user's own are left as they are
_OWN_JIT_OPTIONS = ("TieredStopAtLevel", "TieredCompilation", "CompilationMode")


def jit_java_options(jit: str | None, master: str, java_options: str) -> str:
    """``java_options`` with the compilers ``jit`` asks for; unset, "quick" on local masters (where
    the driver's JVM is the executor of jobs that mostly start and end) and "full" elsewhere."""
    if jit is None:
        jit = "quick" if master.startswith("local") else "full"
    if jit not in JIT_OPTIONS:
        raise ConfigError(
            f"jit={jit!r} is not a choice of the driver JVM's compilers: use 'quick' (C1 only: a faster "
            "start) or 'full' (C1 and C2: faster JVM code in long DataFrame jobs), or leave it unset."
        )
    if not JIT_OPTIONS[jit] or any(option in java_options for option in _OWN_JIT_OPTIONS):
        return java_options
    return f"{java_options} {JIT_OPTIONS[jit]}".strip()


def _set_python_env() -> None:
    """Make executors start this interpreter: without it they run the system python
    and fail with "No module named torch" (the classic newcomer trap)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _submitted_conf() -> dict[str, str]:
    """What spark-submit gave this driver (its JVM's settings), or {} outside spark-submit.

    spark-submit starts the JVM first and hands the Python driver its gateway port; the master,
    deploy mode and ``--conf`` values are then the JVM's, and sparkdp must not replace them."""
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


#: task attempts an embedded session allows: Spark's own cluster default (spark.task.maxFailures),
#: so that a lost asynchronous worker is retried there too (barrier stages are never retried)
LOCAL_TASK_ATTEMPTS = 4


#: bounds of the heap an embedded session's JVM gets when no one set spark.driver.memory: the
#: driver and its local executors share it, and a task's result (a trained model's whole state) is
#: copied a few times there on its way to Python; Spark's own 1g took a 120 MB result but not 300 MB
LOCAL_DRIVER_MEMORY_MIB = (1024, 4096)


def local_driver_memory(total_bytes: int | None = None) -> str:
    """spark.driver.memory for an embedded session: a quarter of this machine's memory, within
    :data:`LOCAL_DRIVER_MEMORY_MIB` (a quarter, since the workers' Python processes need the rest)."""
    if total_bytes is None:
        try:
            total_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # no sysconf (Windows): Spark's own default
            total_bytes = 0
    low, high = LOCAL_DRIVER_MEMORY_MIB
    return f"{max(low, min(high, (total_bytes >> 20) // 4))}m"


def default_master() -> str:
    return f"local[{os.cpu_count() or 1},{LOCAL_TASK_ATTEMPTS}]"


def session(
    master: str | None = None,
    *,
    app_name: str = "sparkdp",
    conf: Mapping[str, str] | None = None,
    warm_up: bool = True,
    log_level: str = "ERROR",
    remote: str | None = None,
    api_mode: str | None = None,
    class_archive: bool = True,
    jit: str | None = None,
):
    """Return the SparkSession to train on.

    Args:
        master: a Spark master URL (``local[N]``, ``spark://host:port``, ``yarn``,
            ``k8s://...``). ``None`` reuses an active session if there is one,
            otherwise starts an embedded ``local[N,4]`` session with N = CPU cores (4 task
            attempts, as on a cluster).
        app_name: the application name shown by the cluster manager.
        conf: extra Spark settings; they override sparkdp's defaults.
        warm_up: on a new ``local``/``local-cluster`` session, start the Python worker
            daemon that sparkdp's stages fork from at once, in the background, and plan a
            stage of their kind, so the daemon's torch import and the JVM's first query
            overlap with whatever the driver does next instead of delaying the first
            training job (:mod:`sparkdp.spark.warm_up`).
        log_level: what Spark's own log prints on the console (``"OFF"`` leaves errors to
            sparkdp's one-line messages; the command line does that unless ``-v``).
        remote: a Spark Connect server, ``sc://host:port`` (a ``master`` of that form means
            the same; unset, the ``SPARK_REMOTE`` environment variable is used when ``master``
            is unset too). The server's own settings apply; ``conf`` only sets runtime ones.
        api_mode: ``"connect"`` starts PySpark's local Spark Connect server for ``master``
            (``spark.api.mode=connect``) and returns a Connect session to it; ``"classic"``
            or unset, a classic session.
        class_archive: start the JVM from this machine's class-data archive when one is built
            (``sparkdp env --build-jvm-archive``; :mod:`sparkdp.spark.jvm_archive`): the session
            starts about 3 s sooner. False: never use it.
        jit: the driver JVM's just-in-time compilers (:data:`JIT_OPTIONS`): ``"quick"`` (C1
            only; the default on local masters: jobs start about 2 s sooner on 2 cores) or
            ``"full"`` (C1 and C2; the default elsewhere, and faster for DataFrames streamed
            through Spark for minutes). An option in ``conf``'s
            ``spark.driver.extraJavaOptions`` that chooses the compilers wins.

    Examples:
        >>> import sparkdp
        >>> spark = sparkdp.session()
        >>> spark.sparkContext.master
        'local[...]'
    """
    from pyspark.sql import SparkSession

    from .cluster import is_connect, master_of

    if remote is None and master is not None and master.startswith("sc://"):
        remote, master = master, None
    if remote is None and master is None and api_mode is None:
        remote = os.environ.get("SPARK_REMOTE") or None
    if remote is not None and remote.startswith("local"):  # pyspark's own spelling of a local server
        remote, master, api_mode = None, master or (None if remote == "local" else remote), "connect"
    connect = remote is not None or (api_mode or "").lower() == "connect"
    active = SparkSession.getActiveSession()
    if (
        active is not None
        and is_connect(active) == connect
        and (master is None or master_of(active) == master)
    ):
        return active
    if active is not None and not connect and not is_connect(active) and master is not None:
        # PySpark keeps one SparkContext per process: getOrCreate would hand back this one and
        # the job would run on its master, not on the one asked for
        raise ConfigError(
            f"a Spark session on {redact(master_of(active))} is already running in this process, "
            f"and a process holds one SparkContext, so sparkdp cannot start one on {redact(master)}. "
            "Stop it first (spark.stop()), or leave out the master to train on the running session."
        )
    if remote is not None:
        return _remote_session(remote, app_name, conf)
    check_java()
    submitted = _submitted_conf()
    master = master or submitted.get("spark.master") or default_master()
    check_master_reachable(master)
    _set_python_env()
    settings: dict[str, Any] = dict(_DEFAULT_CONF)
    settings["spark.pyspark.python"] = os.environ["PYSPARK_PYTHON"]
    settings["spark.pyspark.driver.python"] = os.environ["PYSPARK_DRIVER_PYTHON"]
    settings["spark.executorEnv.PYSPARK_PYTHON"] = os.environ["PYSPARK_PYTHON"]
    settings["spark.driver.extraJavaOptions"] = driver_java_options()
    if master.startswith("local"):
        # Everything stays on loopback; the hostname may resolve to a non-loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        if not (submitted or os.environ.get("SPARK_DRIVER_MEMORY")):  # the JVM is not started yet
            settings["spark.driver.memory"] = local_driver_memory()
    # spark-submit's --conf values (e.g. a shipped venv-pack archive's python) win over sparkdp's
    # defaults, and the caller's conf over both
    settings.update({key: value for key, value in submitted.items() if key in settings})
    settings.update(conf or {})
    settings["spark.driver.extraJavaOptions"] = jit_java_options(
        jit, master, settings["spark.driver.extraJavaOptions"]
    )
    if connect:
        return _local_connect_session(master, app_name, settings, warm_up)
    log.info("starting Spark (%s)", redact(master))
    # What SparkSession.builder.getOrCreate() does, in two steps: the warm-up job needs only
    # the SparkContext, so it runs while the JVM builds the SparkSession (about 2.7 s here).
    sc = _start_context(master, app_name, settings, class_archive)
    _stop_accumulator_server_in_background(sc)
    sc.setLogLevel(log_level)
    _show_task_failures(sc, log_level)
    warm = warm_up and settings["spark.python.daemon.module"] == _DEFAULT_CONF["spark.python.daemon.module"]
    if warm:
        start_warm_up(sc)
    spark = SparkSession.builder.master(master).appName(app_name).config(map=settings).getOrCreate()
    if warm:
        start_planner_warm_up(spark)
    return spark


def _start_context(master: str, app_name: str, settings: dict[str, Any], class_archive: bool) -> Any:
    """The SparkContext, its JVM started from the class-data archive when there is a usable one;
    a JVM that does not come up with it is started again without it (and the archive removed)."""
    from pyspark import SparkContext
    from pyspark.errors import PySparkRuntimeError

    archive = None
    if class_archive and not (
        SparkContext._gateway  # a JVM already runs (spark-submit's, or this process's earlier one)
        or "spark.driver.extraClassPath" in settings  # another class path: the JVM would refuse it
        or jvm_archive.manages_sharing(settings["spark.driver.extraJavaOptions"])
    ):
        archive = jvm_archive.usable_archive()
    if archive is not None:
        with_archive = f"{settings['spark.driver.extraJavaOptions']} {jvm_archive.java_options(archive)}"
        try:
            return SparkContext.getOrCreate(_conf(master, app_name, settings, with_archive))
        except PySparkRuntimeError as exc:
            if exc.getCondition() != "JAVA_GATEWAY_EXITED":
                raise
            log.warning(
                "the JVM did not start with the class archive %s; removing it and starting without it",
                archive,
            )
            jvm_archive.remove(archive)
    return SparkContext.getOrCreate(
        _conf(master, app_name, settings, settings["spark.driver.extraJavaOptions"])
    )


def _conf(master: str, app_name: str, settings: dict[str, Any], java_options: str) -> Any:
    from pyspark import SparkConf

    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    return conf.set("spark.driver.extraJavaOptions", java_options)


def _stop_accumulator_server_in_background(sc: Any) -> None:
    """Let ``spark.stop()`` return without waiting for PySpark's accumulator server, which takes up
    to 1 s more (measured 0.93 s): its one handler serves the JVM's connection in the server's own
    loop and looks for the stop flag once a second. Here the flag is set at once and the server is
    stopped and closed by a daemon thread; a session started meanwhile gets a new server."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is None or getattr(server, "sparkdp_background_stop", False):
        return
    stop, report = server.shutdown, server.handle_error

    def shutdown() -> None:
        server.server_shutdown = True  # the handler ends at its next look; no update is read after it
        threading.Thread(target=stop, name="sparkdp-accumulator-stop", daemon=True).start()

    def handle_error(request: Any, client_address: Any) -> None:
        # a JVM that exits before the handler's next look hangs up on it mid-read (an EOFError
        # socketserver would print): after the stop that is the end, not an error
        if not server.server_shutdown:
            report(request, client_address)

    server.shutdown, server.handle_error = shutdown, handle_error
    server.sparkdp_background_stop = True


def _show_task_failures(sc: Any, log_level: str) -> None:
    """Log failed tasks' stack traces at ``log_level`` when it asks for more than errors: the
    quiet default (log4j2.properties) leaves them to sparkdp's one-line exception."""
    if log_level.upper() not in _VERBOSE_LEVELS:
        return
    jvm = sc._jvm
    level = jvm.org.apache.logging.log4j.Level.toLevel(log_level.upper())
    for name in _TASK_FAILURE_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)


def _remote_session(remote: str, app_name: str, conf: Mapping[str, str] | None):
    """A Spark Connect session to ``remote`` (``sc://host:port``): the server was started with its
    own settings (e.g. by start-connect-server.sh), so only the caller's runtime settings apply."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    log.info("connecting to Spark Connect at %s", redact(remote))
    # PySpark's generic builder refuses a Connect client while this process has a classic
    # SparkContext; the Connect builder does not. Mark the process as Connect as that builder
    # would: PySpark's functions and ML classes choose their Connect implementation by it.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    return ConnectSession.builder.remote(remote).appName(app_name).config(map=dict(conf or {})).getOrCreate()


def _local_connect_session(master: str, app_name: str, settings: dict[str, str], warm_up: bool):
    """PySpark's local Spark Connect server for ``master`` (in this process's JVM) and a Connect
    session to it. The server's executors start ``PYSPARK_PYTHON`` from the environment (Connect
    does not read ``spark.pyspark.python``), which ``_set_python_env`` has set."""
    from pyspark.sql import SparkSession

    log.info("starting Spark with a local Spark Connect server (%s)", redact(master))
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config(map={"spark.api.mode": "connect", **settings})
    )
    with warnings.catch_warnings():
        # The server takes every setting at its start; the client then tries the static ones again as
        # session settings, and PySpark warns about each (CANNOT_MODIFY_CONFIG) though nothing is wrong.
        warnings.filterwarnings("ignore", message=".*CANNOT_MODIFY_CONFIG.*", category=UserWarning)
        spark = builder.getOrCreate()
    if warm_up and settings["spark.python.daemon.module"] == _DEFAULT_CONF["spark.python.daemon.module"]:
        threading.Thread(target=warm_up_connect, args=(spark,), name=WARM_UP_THREAD, daemon=True).start()
    return spark


def stop_quietly(timeout_s: float = 10.0) -> int | None:
    """Stop the active session, if any, so that its JVM ends before the caller returns; return the
    JVM's exit status when this process started it (killed after ``timeout_s``: negative), else None.

    The warm-up job is given ``timeout_s`` to finish first and Spark's log is silenced: a job
    torn down mid-flight logs block-manager errors that would otherwise reach the terminal
    after the command has already printed its result.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None:
        return None
    for thread in threading.enumerate():
        if thread.name == WARM_UP_THREAD:
            thread.join(timeout_s)
    from .cluster import is_connect

    if not is_connect(active):
        active.sparkContext.setLogLevel("OFF")
    active.stop()
    from pyspark import SparkContext

    gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
    proc = getattr(gateway, "proc", None)  # the JVM PySpark launched (None if it was attached to)
    if gateway is None or proc is None:
        return None
    gateway.shutdown()
    proc.stdin.close()  # the JVM exits when its parent's pipe closes
    try:
        return proc.wait(timeout_s)
    except Exception:  # noqa: BLE001 - still going after timeout_s: not worth failing the command
        proc.kill()
        return proc.wait()
