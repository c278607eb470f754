"""Run a function on N Spark tasks as one barrier stage, with a torch.distributed group.

Rendezvous follows TorchDistributor: rank 0's address comes from the barrier
context's task infos, and the port of the TCPStore rank 0 opens is shared with
``allGather`` (barrier-scoped, so a retried stage attempt never meets the failed
attempt's store). Rank 0 binds the store's socket to its own task address itself:
a TCPStore left to bind alone listens on every interface.

The driver watches the stage: if the N tasks are not all running within
``start_timeout_s`` it cancels the job and raises :class:`RendezvousTimeout`
instead of letting Spark wait for slots forever.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import check_int
from ..errors import ConfigError, EnvironmentProblem, RendezvousTimeout, WorkerFailed
from .worker_errors import encode_error, translate_error

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskInfo:
    """What a worker learns about itself from the barrier context."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    gpus: tuple[str, ...]
    cpus: int
    #: On rank 0, the torch.distributed TCPStore it already listens on (see rendezvous).
    store: Any = field(default=None, compare=False, repr=False)


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
    fixed = task_slots(spark)
    if fixed is not None and master_of(spark).startswith("local"):
        return fixed
    if is_connect(spark):
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


def oversubscription(spark, workers: int, threads: int | None) -> str | None:
    """Why ``workers`` workers with ``threads`` torch threads each would run more threads than
    their cores (each thread then waits for a core), or None."""
    per_task = cpus_per_task(spark)
    if threads is not None and threads > per_task:
        return (f"threads={threads} torch threads per worker, but each Spark task holds spark.task.cpus={per_task:g} "
                f"core(s): workers sharing an executor will compete for its cores. Set spark.task.cpus={threads}, "
                "or leave threads unset (sparkdp then uses spark.task.cpus).")
    cores, threads = os.cpu_count() or 1, threads or max(1, int(per_task))
    if on_driver_machine(spark) and workers * threads > cores:
        return (f"{workers} workers x {threads} torch thread(s) on this machine's {cores} "
                "core(s): they will compete for the cores and each step will be slower. Use fewer workers or "
                "threads, or a cluster.")
    return None


def on_driver_machine(spark) -> bool:
    """Whether every executor runs on the driver's machine (``local[N]``, ``local-cluster``)."""
    master = master_of(spark)
    return master == "local" or master.startswith(("local[", "local-cluster["))


def listening_store(host: str, world_size: int):
    """A master ``TCPStore`` listening on ``host`` only, on a port the OS chooses.

    The socket is bound here and handed to the store (which then owns and closes it):
    a TCPStore that binds by itself listens on every interface of the machine.
    """
    from torch.distributed import TCPStore

    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(128)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return TCPStore(host, port, world_size, is_master=True, wait_for_workers=False, master_listen_fd=fd,
                        use_libuv=True)
    except BaseException:
        os.close(fd)
        raise


def rendezvous(with_store: bool = True) -> TaskInfo:
    """This task's rank and the group's master address; with ``with_store``, rank 0 opens the
    torch.distributed TCPStore and every task learns its port."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    infos = ctx.getTaskInfos()
    rank = ctx.partitionId()
    master_addr = infos[0].address.rsplit(":", 1)[0]
    # Rank 0 binds port 0 and shares the port the OS chose: no window in which another
    # process can take a "free" port between choosing and binding it.
    store = listening_store(master_addr, len(infos)) if rank == 0 and with_store else None
    ports = ctx.allGather(str(store.port if store is not None else 0))
    gpus, cpus = task_resources()
    return TaskInfo(rank, len(infos), master_addr, int(ports[0]), gpus, cpus, store)


def task_host() -> str:
    """The address Spark reaches this barrier task's executor on: where a server the task
    starts listens (never every interface)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    return ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0].strip("[]")


def all_gather(message: str) -> list[str]:
    """Every task's ``message`` of this barrier stage, by rank: Spark's own channel, so tasks
    learn each other's addresses without any connection to the driver."""
    from pyspark import BarrierTaskContext

    return list(BarrierTaskContext.get().allGather(message))


def stage_barrier() -> None:
    """Wait until every task of this barrier stage has reached this point."""
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()


def task_resources() -> tuple[tuple[str, ...], int]:
    """The GPU addresses Spark assigned to the running task (``spark.task.resource.gpu.amount``)
    and its cores (``spark.task.cpus``); no GPUs and one core outside a Spark task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return (), 1
    resources = ctx.resources()
    gpus = tuple(resources["gpu"].addresses) if "gpu" in resources else ()
    return gpus, max(1, int(ctx.cpus()))


#: The one column every sparkdp stage returns: a task's result, pickled and sealed.
_RESULT_SCHEMA = "index long, result binary"
_SEAL_BYTES = 32  # HMAC-SHA256


def _seal(key: bytes, index: int, payload: bytes) -> bytes:
    return hmac.new(key, index.to_bytes(8, "big", signed=True) + payload, hashlib.sha256).digest()


def _result_batch(key: bytes, index: int, value: Any):
    """A task's result as one Arrow row: the pickle, after the HMAC of its index and bytes under
    the stage's ``key`` (which only the driver and the stage's own tasks hold)."""
    import pickle

    import pyarrow as pa

    payload = pickle.dumps(value)
    return pa.RecordBatch.from_pydict({"index": [index], "result": [_seal(key, index, payload) + payload]})


def _results(rows, key: bytes) -> list[Any]:
    """The tasks' results in task order (rank or worker index), unpickled on the driver.

    As an RDD's ``collect`` unpickles what its tasks return, but only bytes whose seal checks
    under this stage's ``key``: whatever else reached the result column (the stage's bytes
    cross Spark's channels, and a Connect server's gRPC) is refused before it is unpickled."""
    import pickle

    out = []
    for row in sorted(rows, key=lambda row: row["index"]):
        cell = bytes(row["result"])
        seal, payload = cell[:_SEAL_BYTES], cell[_SEAL_BYTES:]
        if not hmac.compare_digest(seal, _seal(key, int(row["index"]), payload)):
            raise WorkerFailed(f"the result of task {row['index']} does not carry this job's seal; it was not "
                               "read. Something other than sparkdp's task wrote or changed it.")
        out.append(pickle.loads(payload))
    return out


def _stage_key() -> bytes:
    return secrets.token_bytes(32)


def _task_body(fn: Callable[[TaskInfo], Any], key: bytes, store: bool = True) -> Callable:
    def run_partition(batches):
        for _ in batches:  # the one row of spark.range that made this task: nothing to read
            pass
        info = None
        try:
            info = rendezvous(store)
            result = fn(info)
        except BaseException as exc:  # re-raised with a parseable summary for the driver
            raise RuntimeError(encode_error(info.rank if info else -1, exc)) from None
        yield _result_batch(key, info.rank, result)

    return run_partition


def _task_stage(spark, num_tasks: int, body: Callable, *, barrier: bool):
    """``num_tasks`` tasks of ``body`` (a ``mapInArrow`` function) as one DataFrame stage: what
    a classic session and a Spark Connect session both run (no SparkContext, no RDD)."""
    return spark.range(num_tasks, numPartitions=num_tasks).mapInArrow(body, _RESULT_SCHEMA, barrier=barrier)


def barrier_refusal(conf: dict[str, str]) -> str | None:
    """Why Spark would refuse a barrier stage with these settings, in words (None: it would not).

    Barrier stages need a fixed set of executors (SPARK-24942): with dynamic allocation on,
    Spark fails the job at submission with a message that names neither sparkdp nor the fix."""
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        return ("synchronous strategies (allreduce, average) run as a Spark barrier stage, which Spark does not "
                "allow with dynamic allocation (spark.dynamicAllocation.enabled=true): all workers must hold "
                "their executors for the whole stage. Turn it off for this application (--conf "
                "spark.dynamicAllocation.enabled=false), or train asynchronously (e.g. strategy='asgd'), whose "
                "workers are ordinary tasks that tolerate executors coming and going.")
    return None


class BarrierStage:
    """One Spark job whose barrier stage needs ``num_workers`` tasks running at once.

    :meth:`run` checks the cluster has the slots, then runs the job under :func:`run_watched`
    until all its tasks have started. Used by :func:`run_barrier` and the DataFrame path.
    """

    def __init__(self, spark, num_workers: int, *, description: str, start_timeout_s: float = 60.0) -> None:
        check_int("workers", num_workers)
        self.spark = spark
        self.num_workers = num_workers
        self.description = description
        self.start_timeout_s = start_timeout_s

    def _wait_for_executors(self) -> None:
        """On a cluster, executors register after the application starts (and come back after a
        loss): Spark refuses a barrier stage with more tasks than the slots it has *now*, so
        wait up to ``start_timeout_s`` for enough of them before submitting."""
        master = master_of(self.spark)
        if master.startswith("local"):
            return
        deadline = time.monotonic() + self.start_timeout_s
        while (available := available_slots(self.spark)) is not None and available < self.num_workers:
            if time.monotonic() > deadline:
                raise RendezvousTimeout(
                    f"requested {self.num_workers} workers, but after {self.start_timeout_s:.0f} s the cluster at "
                    f"{master!r} has {available} task slot(s) (a synchronous job needs all of them at once). "
                    "Use fewer workers, add executors, or raise `start_timeout_s`.")
            time.sleep(0.5)

    def run(self, collect: Callable[[], list[Any]]) -> list[Any]:
        """Run ``collect()`` (the action that runs the stage) and return what it returned."""
        spark, n = self.spark, self.num_workers
        master = master_of(spark)
        refusal = barrier_refusal({"spark.dynamicAllocation.enabled":
                                   spark_conf(spark, "spark.dynamicAllocation.enabled", "false") or "false"})
        if refusal:
            raise ConfigError(refusal)
        slots = task_slots(spark)
        if slots is not None and n > slots:
            raise RendezvousTimeout(too_few_slots_message(n, slots, master))
        self._wait_for_executors()
        return run_watched(spark, collect, n, description=self.description, start_timeout_s=self.start_timeout_s,
                           need_all=True, too_slow=(
                               f"requested {n} workers, but Spark did not start them all within "
                               f"{self.start_timeout_s:.0f} s on master {master!r} (a barrier stage needs all of "
                               "them at once). Lower `workers`, add executors/cores, or raise `start_timeout_s`."))


class JobControl:
    """Name, watch and cancel the Spark job(s) one thread submits, on either session kind.

    Spark Connect: an operation tag (``addTag`` / ``interruptTag``) and the server's progress
    reports (``registerProgressHandler``, stages with their task counts every ~2 s). Classic: a
    job group (``setJobGroup(interruptOnCancel=True)`` / ``cancelJobGroup``; a classic session's
    ``interruptTag`` did not cancel a running ``mapInArrow`` collect in PySpark 4.3) and the
    SparkContext's status tracker. Everything else about a stage is the same DataFrame code.
    """

    def __init__(self, spark, description: str) -> None:
        self.spark, self.description = spark, description
        self.name = f"sparkdp-{uuid.uuid4().hex[:12]}"
        self.connect = is_connect(spark)
        self._thread: int | None = None
        self._stages: list[Any] = []
        self._inflight = 0
        self._lock = threading.Lock()

    # -- in the submitting thread
    def __enter__(self) -> JobControl:
        self._thread = threading.get_ident()
        if self.connect:
            self.spark.registerProgressHandler(self._on_progress)
            self.spark.addTag(self.name)
        else:
            self.spark.sparkContext.setJobGroup(self.name, self.description, interruptOnCancel=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.connect:
            self.spark.removeTag(self.name)
            self.spark.removeProgressHandler(self._on_progress)
        else:
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def _on_progress(self, stages, inflight_tasks, operation_id=None, done=False) -> None:
        if threading.get_ident() != self._thread:  # another thread's operation on this session
            return
        with self._lock:
            self._stages, self._inflight = list(stages or []), inflight_tasks

    # -- from any thread
    def cancel(self) -> None:
        if self.connect:
            self.spark.interruptTag(self.name)
        else:
            self.spark.sparkContext.cancelJobGroup(self.name)

    def progress(self, num_tasks: int) -> tuple[int, bool]:
        """Tasks running or done so far, and whether one stage has all ``num_tasks`` going."""
        if self.connect:
            with self._lock:
                stages, inflight = self._stages, self._inflight
            going = [s.num_completed_tasks + (0 if s.done else inflight) for s in stages]
        else:
            going = [stage.numActiveTasks + stage.numCompletedTasks
                     for stage in _stages(self.spark.sparkContext, self.name)]
        return sum(going), any(n >= num_tasks for n in going)


def run_watched(spark, collect: Callable[[], list[Any]], num_tasks: int, *, description: str,
                start_timeout_s: float, need_all: bool, too_slow: str) -> list[Any]:
    """Run ``collect()`` (a Spark action of ``num_tasks`` tasks) in a thread under its own
    :class:`JobControl`; cancel it and raise ``RendezvousTimeout(too_slow)`` when its tasks have
    not started within ``start_timeout_s`` — all of them (``need_all``, a barrier stage) or any —
    the clock restarting whenever a task makes progress (a DataFrame's job may run ordinary
    stages first). A task's error becomes the sparkdp error it carried."""
    control = JobControl(spark, description)
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def submit() -> None:
        try:
            with control:
                outcome["results"] = collect()
        except BaseException as exc:  # handed to the waiting thread below
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=submit, name=control.name, daemon=True).start()
    deadline = time.monotonic() + start_timeout_s
    started, seen = False, -1
    try:
        while not done.wait(0.2):
            if started:
                continue
            progress, all_started = control.progress(num_tasks)
            started = all_started if need_all else progress > 0
            if progress != seen:
                seen, deadline = progress, time.monotonic() + start_timeout_s
            if not started and time.monotonic() > deadline:
                control.cancel()
                done.wait(30)
                raise RendezvousTimeout(too_slow)
    except KeyboardInterrupt:  # Ctrl-C on the driver: the job's tasks stop too
        control.cancel()
        raise
    if "error" in outcome:
        raise translate_error(outcome["error"], num_tasks, master_of(spark)) from None
    return outcome["results"]


def _none_started(seconds: float, master: str, what: str) -> str:
    return (f"{what} did not start within {seconds:.0f} s on master {master!r}: no executor took any of its tasks. "
            "Check that the cluster has free cores and executors that can hold the tasks' resources "
            "(spark.task.cpus, spark.task.resource.*, spark.executor.resource.*), or raise `start_timeout_s`.")


def run_barrier(fn: Callable[[TaskInfo], Any], num_workers: int, *, spark,
                start_timeout_s: float = 60.0, description: str = "sparkdp training",
                store: bool = True) -> list[Any]:
    """Run ``fn(task_info)`` on ``num_workers`` concurrent Spark tasks; return results by rank.

    One barrier ``mapInArrow`` stage over ``spark.range(num_workers)``: the same code on a
    classic and on a Spark Connect session. ``store=False``: the tasks need no torch.distributed
    group, and rank 0 opens no TCPStore.

    Raises:
        ConfigError: ``num_workers`` < 1.
        RendezvousTimeout: the cluster cannot run ``num_workers`` tasks at once, or
            they did not all start within ``start_timeout_s``.
        WorkerFailed: a task raised; the message carries the worker's own error.
    """
    stage = BarrierStage(spark, num_workers, description=description, start_timeout_s=start_timeout_s)
    key = _stage_key()
    df = _task_stage(spark, num_workers, _task_body(fn, key, store), barrier=True)
    return _results(stage.run(df.collect), key)


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
    try:
        family = socket.getaddrinfo(server[0], server[1], type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # a UDP "connect" sends nothing
            probe.connect((server[0], server[1]))
            return probe.getsockname()[0]
    except OSError as exc:
        raise EnvironmentProblem(f"cannot find this machine's address toward the Spark Connect server "
                                 f"{server[0]}:{server[1]}: {exc}") from exc


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


def unreachable_reason(spark, *, timeout_s: float = 5.0, start_timeout_s: float = 60.0) -> str | None:
    """Why executors cannot open a TCP connection to this process (a socket listening for a
    moment on :func:`driver_host`), or None when they can or need not (see
    :func:`executors_may_not_reach_us`). Costs one small stage, a few seconds at most."""
    if not executors_may_not_reach_us(spark):
        return None
    with socket.create_server((driver_host(spark), 0)) as listener:  # the probes' connections wait in its backlog
        host, port = listener.getsockname()[:2]
        failed = _probe(spark, f"[{host}]:{port}" if ":" in host else f"{host}:{port}", timeout_s,
                        "this process", start_timeout_s)
    return failed


def check_reachable(spark, address: str, *, timeout_s: float = 5.0, what: str = "the parameter server",
                    start_timeout_s: float = 60.0) -> None:
    """Fail fast, naming the address, when executors cannot open a TCP connection to ``address``
    (``host:port`` on the driver) — instead of every task waiting out its connect timeout."""
    client = connect_server(spark) is not None
    failed = _probe(spark, address, timeout_s, f"{what} in this Spark Connect client" if client else
                    f"{what} on the driver", start_timeout_s)
    if failed and client:
        raise EnvironmentProblem(f"{failed}. The executors cannot connect to this client: train with a synchronous "
                                 "strategy, or with sparkdp.fit / sparkdp train, which run the parameter server on "
                                 "the executors (docs/guide/connect.md).")
    if failed:
        raise EnvironmentProblem(f"{failed}. Set spark.driver.host to an address of the driver that the executors "
                                 "can reach, and let a firewall between them pass TCP to the driver "
                                 "(docs/guide/clusters.md).")


def _probe(spark, address: str, timeout_s: float, what: str, start_timeout_s: float) -> str | None:
    """One small task per task slot (at most 16) tries to connect to ``address``; on a local
    master this is the loopback and costs a fraction of a second. What failed, or None."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    tries = max(1, min(task_slots(spark) or 1, 16))
    key = _stage_key()

    def probe(batches):
        import socket as sock

        from pyspark import TaskContext

        for _ in batches:
            pass
        where = sock.gethostname()
        ctx = TaskContext.get()
        index = ctx.partitionId() if ctx is not None else 0
        try:
            with sock.create_connection((host, int(port)), timeout=timeout_s):
                yield _result_batch(key, index, (where, None))
        except OSError as exc:
            yield _result_batch(key, index, (where, f"{type(exc).__name__}: {exc}"))

    description = f"sparkdp: can executors reach {what} at {address}?"
    df = _task_stage(spark, tries, probe, barrier=False)
    results = _results(run_watched(spark, df.collect, tries, description=description, start_timeout_s=start_timeout_s,
                                   need_all=False, too_slow=_none_started(start_timeout_s, master_of(spark),
                                                                          "the connectivity check")), key)
    failed = [(h, err) for h, err in results if err is not None]
    if not failed:
        return None
    hosts = ", ".join(sorted({h for h, _ in failed}))
    return f"executors on {hosts} cannot reach {what} at {address} within {timeout_s:g} s ({failed[0][1]})"


def task_attempt() -> int:
    """Which attempt of its Spark task is running (0: the first; 0 outside Spark)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


def run_tasks(fn: Callable[[int], Any], num_workers: int, *, spark, description: str = "sparkdp workers",
              start_timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(worker_index)`` as ``num_workers`` ordinary (non-barrier) Spark tasks.

    Unlike a barrier stage, Spark retries a failed task on its own (up to
    ``spark.task.maxFailures``; ``local[N,F]`` in local mode), and the tasks need not
    all run at once: with fewer slots than workers they run in waves. If none of them has started
    within ``start_timeout_s`` (no executor can take one), the job is cancelled with a
    ``RendezvousTimeout`` instead of waiting for ever.
    """
    check_int("workers", num_workers)
    slots = task_slots(spark)
    if slots is not None and num_workers > slots:
        log.warning("%d asynchronous workers on %d task slots: they will run in waves, not all at once",
                    num_workers, slots)
    key = _stage_key()

    def run_partition(batches):
        from pyspark import TaskContext

        for _ in batches:
            pass
        ctx = TaskContext.get()
        index = ctx.partitionId() if ctx is not None else 0
        try:
            result = fn(index)
        except BaseException as exc:  # re-raised with a parseable summary for the driver
            raise RuntimeError(encode_error(index, exc)) from None
        yield _result_batch(key, index, result)

    df = _task_stage(spark, num_workers, run_partition, barrier=False)
    return _results(run_watched(spark, df.collect, num_workers, description=description,
                                start_timeout_s=start_timeout_s, need_all=False,
                                too_slow=_none_started(start_timeout_s, master_of(spark),
                                                       f"the {num_workers} asynchronous workers")), key)


def _stages(sc, group: str) -> list[Any]:
    """The stage infos of ``group``'s jobs so far (a classic SparkContext's status tracker)."""
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(job_id) for job_id in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(stage_id) for job in jobs if job for stage_id in job.stageIds]
    return [stage for stage in stages if stage]


def too_few_slots_message(requested: int, slots: int, master: str) -> str:
    return (
        f"requested {requested} workers, but Spark master {master!r} can run at most {slots} tasks at once, "
        f"and a synchronous job needs all {requested} running together. Use workers <= {slots}, "
        f"or start Spark with more cores (e.g. --master local[{requested}]) or more executors."
    )
