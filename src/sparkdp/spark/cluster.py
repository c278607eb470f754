"""What a Spark session's cluster is, read the same way on classic and Spark Connect sessions:
its master and task slots, whether executors share this machine, and the address they reach
this process on. Nothing here runs a stage (see :mod:`sparkdp.spark.launcher`)."""

from __future__ import annotations

import os
import re
import socket

from ..errors import EnvironmentProblem


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``spark.api.mode=connect`` or ``sc://``):
    no SparkContext, RDDs or py4j there; DataFrames, ``spark.conf`` and job tags only."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_conf(spark, key: str, default: str | None = None) -> str | None:
    """A setting of the application, read the way both session kinds allow: ``spark.conf`` on a
    session (classic or Connect; it also answers static and core settings such as
    ``spark.master``), ``getConf()`` on a SparkContext (older callers)."""
    if hasattr(spark, "getConf"):  # a SparkContext
        return spark.getConf().get(key, default)
    try:
        return spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - a Connect server that refuses to show it
        return default


def master_of(spark) -> str:
    return spark_conf(spark, "spark.master", "local") or "local"


def cpus_per_task(spark) -> float:
    """``spark.task.cpus`` (Spark accepts fractions of a core)."""
    return float(spark_conf(spark, "spark.task.cpus", "1") or "1")


def _default_parallelism(spark) -> int:
    if hasattr(spark, "defaultParallelism"):
        return spark.defaultParallelism
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    return os.cpu_count() or 1  # local[*] on a Connect server of this machine: its cores


def task_slots(spark) -> int | None:
    """How many tasks the cluster can run at once, when it can be known up front."""
    master = master_of(spark)
    per_task = cpus_per_task(spark)
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master)
    if match:
        n = match.group(1)
        cores = (_default_parallelism(spark) if n == "*" else int(n)) if n else 1
        return int(cores // per_task)
    if master.startswith("local-cluster"):
        m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
        return int((int(m.group(1)) * int(m.group(2))) // per_task) if m else None
    return None  # cluster managers: executors may still be arriving; the start timeout decides


def available_slots(spark) -> int | None:
    """Task slots the cluster has right now: fixed on local masters; elsewhere the cores of the
    live executors (the scheduler backend's count, classic sessions only), None when that cannot
    be known (a Connect session: the start timeout decides)."""
    fixed = task_slots(spark)  # known only on local masters
    if fixed is not None or is_connect(spark):
        return fixed
    sc = spark if hasattr(spark, "_jsc") else spark.sparkContext
    try:  # CoarseGrainedSchedulerBackend (standalone, YARN, Kubernetes) keeps the live core count
        cores = int(sc._jsc.sc().schedulerBackend().totalCoreCount())
    except Exception:  # noqa: BLE001 - another backend, or py4j could not reach it
        return fixed
    return int(cores // cpus_per_task(spark))


def default_workers(spark) -> int:
    """Workers when the user gives none: every task slot of a local master, or of the executors
    registered on a cluster when the job starts; 2 while none has registered yet."""
    return task_slots(spark) or available_slots(spark) or 2


def oversubscription(spark, workers: int, threads: int | None, reserved: int | None = None) -> str | None:
    """Why ``workers`` workers with ``threads`` torch threads each would run more threads than
    their cores (each thread then waits for a core), or None. ``reserved``: task slots the caller
    keeps free for this job's workers alone (a search's slot pool), whose cores their threads
    may use beyond ``spark.task.cpus`` without competing."""
    per_task = cpus_per_task(spark)
    within = reserved is not None and threads is not None and workers * threads <= reserved * per_task
    if threads is not None and threads > per_task and not within:
        return (
            f"threads={threads} torch threads per worker, but each Spark task holds spark.task.cpus={per_task:g} "
            f"core(s): workers sharing an executor will compete for its cores. Set spark.task.cpus={threads}, "
            "or leave threads unset (sparkdp then uses spark.task.cpus)."
        )
    cores, threads = os.cpu_count() or 1, threads or max(1, int(per_task))
    if on_driver_machine(spark) and workers * threads > cores:
        return (
            f"{workers} workers x {threads} torch thread(s) on this machine's {cores} "
            "core(s): they will compete for the cores and each step will be slower. Use fewer workers or "
            "threads, or a cluster."
        )
    return None


def on_driver_machine(spark) -> bool:
    """Whether every executor runs on the driver's machine (``local[N]``, ``local-cluster``)."""
    master = master_of(spark)
    return master == "local" or master.startswith(("local[", "local-cluster["))


def too_few_slots_message(requested: int, slots: int, master: str) -> str:
    return (
        f"requested {requested} workers, but Spark master {master!r} can run at most {slots} tasks at once, "
        f"and a synchronous job needs all {requested} running together. Use workers <= {slots}, "
        f"or start Spark with more cores (e.g. --master local[{requested}]) or more executors."
    )


def barrier_refusal(conf: dict[str, str]) -> str | None:
    """Why Spark would refuse a barrier stage with these settings, in words (None: it would not).

    Barrier stages need a fixed set of executors (SPARK-24942): with dynamic allocation on,
    Spark fails the job at submission with a message that names neither sparkdp nor the fix."""
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        return (
            "synchronous strategies (allreduce, average) run as a Spark barrier stage, which Spark does not "
            "allow with dynamic allocation (spark.dynamicAllocation.enabled=true): all workers must hold "
            "their executors for the whole stage. Turn it off for this application (--conf "
            "spark.dynamicAllocation.enabled=false), or train asynchronously (e.g. strategy='asgd'), whose "
            "workers are ordinary tasks that tolerate executors coming and going."
        )
    return None


def driver_host(spark) -> str:
    """The address executors reach this process on (where the parameter server and the monitoring
    hub listen): ``spark.driver.host`` on a classic session. On a Spark Connect session this
    process is the server's client, not its driver: its own address on the way to the server
    (the server's machine, and so its cluster, sees the client there if at all), or the
    server's ``spark.driver.host`` when the server runs on this machine."""
    conf_host = spark_conf(spark, "spark.driver.host", "127.0.0.1") or "127.0.0.1"
    server = connect_server(spark)
    if server is None or _is_loopback(server[0]):
        return conf_host
    from ..comm.torch_dist import source_address

    if (own := source_address(server[0])) is None:
        raise EnvironmentProblem(
            f"cannot find this machine's address toward the Spark Connect server "
            f"{server[0]}:{server[1]}: no route to it, or its name does not resolve"
        )
    return own


def connect_server(spark) -> tuple[str, int] | None:
    """(host, port) of a Spark Connect session's server; None on a classic session."""
    if not is_connect(spark):
        return None
    client = spark.client
    endpoint = getattr(getattr(client, "_builder", None), "endpoint", None) or f"{client.host}:15002"
    host, _, port = endpoint.rpartition(":")  # the client's ChannelBuilder: "host:port"
    return host.strip("[]"), int(port)


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def executors_may_not_reach_us(spark) -> bool:
    """Whether executors may run on other machines than this process: a cluster master, or a
    Spark Connect server on another machine. On a local master of this process (or of a
    Connect server on this machine) they reach it over loopback."""
    server = connect_server(spark)
    return not master_of(spark).startswith("local") or (server is not None and not _is_loopback(server[0]))
