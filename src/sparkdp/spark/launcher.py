"""Run a function on N Spark tasks as one stage: a barrier stage (all at once, a
torch.distributed group among them; see :mod:`sparkdp.spark.task` for the rendezvous) or
ordinary tasks. The same DataFrame code on a classic and a Spark Connect session.

The driver watches the stage: if its tasks are not running within ``start_timeout_s`` it
cancels the job and raises :class:`RendezvousTimeout` instead of letting Spark wait for slots
forever. Each task's result comes back as data, never a pickle (:mod:`sparkdp.spark.results`),
and whether executors can reach this process is checked with one small stage of the same kind.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..config import check_int
from ..errors import ConfigError, EnvironmentProblem, RendezvousTimeout, WorkerFailed
from .board import RendezvousBoard
from .cluster import (
    available_slots,
    barrier_refusal,
    connect_server,
    driver_host,
    executors_may_not_reach_us,
    is_connect,
    master_of,
    on_driver_machine,
    spark_conf,
    task_slots,
    too_few_slots_message,
)
from .results import decode, encode
from .task import TaskInfo, rendezvous
from .worker_errors import encode_error, translate_error

log = logging.getLogger(__name__)


#: What every sparkdp stage returns: a task's result as sparkdp state bytes (results.py), cut into
#: ``parts`` rows of at most RESULT_PART_BYTES each.
_RESULT_SCHEMA = "index long, part long, parts long, result binary"

#: The most bytes of a result one row carries. A trained model's state comes back whole from rank 0;
#: as one row of hundreds of MB, the driver's JVM copies it whole several times (each copy one huge
#: array) and a local session's default 1g heap lost a 300 MB one; rows this size travel in pieces.
RESULT_PART_BYTES = 8 << 20
#: rows per Arrow batch of a result: 128 parts of 8 MiB, 1 GiB (a batch's offsets are int32)
_PARTS_PER_BATCH = 128


def _result_batch(stage: str, index: int, value: Any):
    """A task's result as an Arrow table of rows (:func:`sparkdp.spark.results.encode`: data, no
    pickle). The rows' cells are slices of the encoded bytes, not copies: a worker returning a
    large model holds its result once. Batches of at most ``_PARTS_PER_BATCH`` rows keep each
    batch's int32 offsets (Spark's binary type) below 2 GiB."""
    import pyarrow as pa

    data = pa.py_buffer(encode(stage, index, value))
    parts = max(1, -(-data.size // RESULT_PART_BYTES))
    batches = []
    for first in range(0, parts, _PARTS_PER_BATCH):
        rows = range(first, min(first + _PARTS_PER_BATCH, parts))
        start = first * RESULT_PART_BYTES
        ends = [min(at * RESULT_PART_BYTES, data.size) - start for at in range(first, rows.stop + 1)]
        cells = pa.Array.from_buffers(
            pa.binary(), len(rows), [None, _packed(ends, "i"), data.slice(start, ends[-1])]
        )
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    _int64s([index] * len(rows)),
                    _int64s(list(rows)),
                    _int64s([parts] * len(rows)),
                    cells,
                ],
                names=["index", "part", "parts", "result"],
            )
        )
    return pa.Table.from_batches(batches)


def _packed(values: list[int], code: str):
    """``values`` as an Arrow buffer of little-endian ``struct`` ``code`` numbers. Not ``pa.array``:
    its first call imports pandas (about 0.3 s), which every task would pay after its work."""
    import struct

    import pyarrow as pa

    return pa.py_buffer(struct.pack(f"<{len(values)}{code}", *values))


def _int64s(values: list[int]):
    import pyarrow as pa

    return pa.Array.from_buffers(pa.int64(), len(values), [None, _packed(values, "q")])


def _results(rows, stage: str, num_tasks: int) -> list[Any]:
    """The tasks' results in task order (rank or worker index), decoded on the driver.

    Nothing in a result cell is run: the decoder builds back data only (numbers, strings,
    tensors, arrays, sparkdp's own records). A cell that is not a result of this stage's task
    at its row's index (damaged, from elsewhere, a pickle) is refused with WorkerFailed."""
    by_task: dict[int, dict[int, Any]] = {}
    counts: dict[int, set[int]] = {}
    foreign = False
    for row in rows:
        index, part = int(row["index"]), int(row["part"])
        foreign |= part in by_task.setdefault(index, {}) or index not in range(num_tasks)
        by_task[index][part] = row["result"]
        counts.setdefault(index, set()).add(int(row["parts"]))
    indices = sorted(by_task)
    if foreign or any(len(c) != 1 or max(by_task[i]) >= min(c) for i, c in counts.items()):
        raise WorkerFailed(
            f"the stage's {num_tasks} task(s) returned results for tasks {indices} with repeated or "
            f"extra parts; expected one for each of 0-{num_tasks - 1}. Something other than sparkdp's "
            "tasks wrote them."
        )
    complete = [i for i in indices if len(by_task[i]) == min(counts[i])]
    if complete != list(range(num_tasks)):
        # the job succeeded but rows are missing: the driver's JVM failed to hand them to Python
        # (an OutOfMemoryError in its "serve-DataFrame" thread is printed, not raised)
        raise WorkerFailed(
            f"the driver received the whole results of tasks {complete} of the stage's {num_tasks} task(s): "
            "its JVM ran out of heap while it passed the rest to Python (java.lang.OutOfMemoryError in "
            "the driver's log). Rank 0 returns the trained model's whole state; raise spark.driver.memory "
            "before the session starts, e.g. sparkdp.session(conf={'spark.driver.memory': '8g'}) or "
            "spark-submit --driver-memory 8g (docs/guide/reliability.md)."
        )
    return [_decoded(by_task[index], stage, index) for index in indices]


def _decoded(parts: dict[int, Any], stage: str, index: int) -> Any:
    """Task ``index``'s result from its rows' cells. Decoding a result of N bytes holds about
    twice N plus the Python objects of its JSON document (:func:`sparkdp.spark.results.decode`);
    a driver that has not that much memory gets a WorkerFailed saying so, not a MemoryError."""
    size = sum(len(cell) for cell in parts.values())
    try:
        return decode(b"".join(bytes(parts[part]) for part in range(len(parts))), stage, index)
    except ValueError as err:
        raise WorkerFailed(
            f"the result of task {index} was not read: {err}. Something other than sparkdp's "
            "task wrote or changed it; nothing in it was run."
        ) from None
    except MemoryError:
        raise WorkerFailed(
            f"the result of task {index} ({size:,} bytes) did not fit in the driver's memory as it "
            "was read back: give the driver process more memory (its own limit, not only "
            "spark.driver.memory, which is the JVM's) or return less from the task "
            "(docs/guide/reliability.md)."
        ) from None


class JobCancelled(Exception):
    """The driver cancelled the job (``cancel=`` of :func:`run_tasks`): its result is not wanted."""


def _stage_id() -> str:
    """Names a stage's results (not a secret: it lets the driver tell them from anyone else's)."""
    return uuid.uuid4().hex


def _task_body(stage: str, start: Callable[[], tuple[int, Any]], fn: Callable[[Any], Any]) -> Callable:
    """A ``mapInArrow`` function: ``start()`` gives the task's index (rank or worker) and the
    argument of ``fn``; the task returns ``fn``'s result encoded as data. A result that cannot
    be (not data: a model object, an open file) fails the task with a ConfigError saying so."""

    def run_partition(batches):
        for _ in batches:  # the one row of spark.range that made this task: nothing to read
            pass
        index = -1
        try:
            index, argument = start()
            table = _result_batch(stage, index, fn(argument))
        except BaseException as exc:  # re-raised with a parseable summary for the driver
            raise RuntimeError(encode_error(index, exc)) from None
        yield from table.to_batches()

    return run_partition


def _task_stage(spark, num_tasks: int, body: Callable, *, barrier: bool):
    """``num_tasks`` tasks of ``body`` (a ``mapInArrow`` function) as one DataFrame stage: what
    a classic session and a Spark Connect session both run (no SparkContext, no RDD)."""
    return spark.range(num_tasks, numPartitions=num_tasks).mapInArrow(body, _RESULT_SCHEMA, barrier=barrier)


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
                    "Use fewer workers, add executors, or raise `start_timeout_s`."
                )
            time.sleep(0.5)

    def run(self, collect: Callable[[], list[Any]]) -> list[Any]:
        """Run ``collect()`` (the action that runs the stage) and return what it returned."""
        spark, n = self.spark, self.num_workers
        master = master_of(spark)
        refusal = barrier_refusal(
            {
                "spark.dynamicAllocation.enabled": spark_conf(
                    spark, "spark.dynamicAllocation.enabled", "false"
                )
                or "false"
            }
        )
        if refusal:
            raise ConfigError(refusal)
        slots = task_slots(spark)
        if slots is not None and n > slots:
            raise RendezvousTimeout(too_few_slots_message(n, slots, master))
        self._wait_for_executors()
        return run_watched(
            spark,
            collect,
            n,
            description=self.description,
            start_timeout_s=self.start_timeout_s,
            need_all=True,
            too_slow=(
                f"requested {n} workers, but Spark did not start them all within "
                f"{self.start_timeout_s:.0f} s on master {master!r} (a barrier stage needs all of "
                "them at once). Lower `workers`, add executors/cores, or raise `start_timeout_s`."
            ),
        )


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
            going = [
                stage.numActiveTasks + stage.numCompletedTasks
                for stage in _stages(self.spark.sparkContext, self.name)
            ]
        return sum(going), any(n >= num_tasks for n in going)


def run_watched(
    spark,
    collect: Callable[[], list[Any]],
    num_tasks: int,
    *,
    description: str,
    start_timeout_s: float,
    need_all: bool,
    too_slow: str,
    cancel: threading.Event | None = None,
) -> list[Any]:
    """Run ``collect()`` (a Spark action of ``num_tasks`` tasks) in a thread under its own
    :class:`JobControl`; cancel it and raise ``RendezvousTimeout(too_slow)`` when its tasks have
    not started within ``start_timeout_s`` — all of them (``need_all``, a barrier stage) or any —
    the clock restarting whenever a task makes progress (a DataFrame's job may run ordinary
    stages first). A task's error becomes the sparkdp error it carried. When ``cancel`` is set,
    the job is cancelled and :class:`JobCancelled` raised."""
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
            if cancel is not None and cancel.is_set():
                control.cancel()
                done.wait(30)
                raise JobCancelled(f"{description}: cancelled by the driver")
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
    return (
        f"{what} did not start within {seconds:.0f} s on master {master!r}: no executor took any of its tasks. "
        "Check that the cluster has free cores and executors that can hold the tasks' resources "
        "(spark.task.cpus, spark.task.resource.*, spark.executor.resource.*), or raise `start_timeout_s`."
    )


def run_barrier(
    fn: Callable[[TaskInfo], Any],
    num_workers: int,
    *,
    spark,
    start_timeout_s: float = 60.0,
    description: str = "sparkdp training",
    store: bool = True,
) -> list[Any]:
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
    stage_id = _stage_id()
    with rendezvous_board(spark, num_workers) as board:
        link = board.link if board is not None else None

        def start() -> tuple[int, TaskInfo]:
            info = rendezvous(store, link)
            return info.rank, info

        df = _task_stage(spark, num_workers, _task_body(stage_id, start, fn), barrier=True)
        return _results(stage.run(df.collect), stage_id, num_workers)


@contextlib.contextmanager
def rendezvous_board(spark, num_workers: int) -> Iterator[RendezvousBoard | None]:
    """The driver's rendezvous board for a barrier stage of ``num_workers`` tasks, where every
    executor runs on this machine (:mod:`sparkdp.spark.board`); elsewhere None: the tasks keep
    Spark's ``allGather``. A Spark Connect session's executors belong to its server's machine."""
    if is_connect(spark) or not on_driver_machine(spark):
        yield None
        return
    with RendezvousBoard(num_workers) as board:
        yield board


def unreachable_reason(spark, *, timeout_s: float = 5.0, start_timeout_s: float = 60.0) -> str | None:
    """Why executors cannot open a TCP connection to this process (a socket listening for a
    moment on :func:`driver_host`), or None when they can or need not (see
    :func:`executors_may_not_reach_us`). Costs one small stage, a few seconds at most."""
    if not executors_may_not_reach_us(spark):
        return None
    with socket.create_server(
        (driver_host(spark), 0)
    ) as listener:  # the probes' connections wait in its backlog
        host, port = listener.getsockname()[:2]
        failed = _probe(
            spark,
            f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            timeout_s,
            "this process",
            start_timeout_s,
        )
    return failed


def check_reachable(
    spark,
    address: str,
    *,
    timeout_s: float = 5.0,
    what: str = "the parameter server",
    start_timeout_s: float = 60.0,
) -> None:
    """Fail fast, naming the address, when executors cannot open a TCP connection to ``address``
    (``host:port`` on the driver) — instead of every task waiting out its connect timeout."""
    client = connect_server(spark) is not None
    failed = _probe(
        spark,
        address,
        timeout_s,
        f"{what} in this Spark Connect client" if client else f"{what} on the driver",
        start_timeout_s,
    )
    if failed and client:
        raise EnvironmentProblem(
            f"{failed}. The executors cannot connect to this client: train with a synchronous "
            "strategy, or with sparkdp.fit / sparkdp train, which run the parameter server on "
            "the executors (docs/guide/connect.md)."
        )
    if failed:
        raise EnvironmentProblem(
            f"{failed}. Set spark.driver.host to an address of the driver that the executors "
            "can reach, and let a firewall between them pass TCP to the driver "
            "(docs/guide/clusters.md)."
        )


def _probe(spark, address: str, timeout_s: float, what: str, start_timeout_s: float) -> str | None:
    """One small task per task slot (at most 16) tries to connect to ``address``; on a local
    master this is the loopback and costs a fraction of a second. What failed, or None."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    tries = max(1, min(task_slots(spark) or 1, 16))

    def probe(_index: int) -> tuple[str, str | None]:
        import socket as sock

        try:
            with sock.create_connection((host, int(port)), timeout=timeout_s):
                return sock.gethostname(), None
        except OSError as exc:
            return sock.gethostname(), f"{type(exc).__name__}: {exc}"

    results = run_tasks(
        probe,
        tries,
        spark=spark,
        description=f"sparkdp: can executors reach {what} at {address}?",
        start_timeout_s=start_timeout_s,
        what="the connectivity check",
    )
    failed = [(h, err) for h, err in results if err is not None]
    if not failed:
        return None
    hosts = ", ".join(sorted({h for h, _ in failed}))
    return f"executors on {hosts} cannot reach {what} at {address} within {timeout_s:g} s ({failed[0][1]})"


def run_tasks(
    fn: Callable[[int], Any],
    num_workers: int,
    *,
    spark,
    description: str = "sparkdp workers",
    start_timeout_s: float = 60.0,
    what: str | None = None,
    cancel: threading.Event | None = None,
) -> list[Any]:
    """Run ``fn(worker_index)`` as ``num_workers`` ordinary (non-barrier) Spark tasks.

    Unlike a barrier stage, Spark retries a failed task on its own (up to
    ``spark.task.maxFailures``; ``local[N,F]`` in local mode; a body may stop such a retry at
    once to leave the restart to its caller), and the tasks need not
    all run at once: with fewer slots than workers they run in waves. If none of them has started
    within ``start_timeout_s`` (no executor can take one), the job is cancelled with a
    ``RendezvousTimeout`` (naming ``what`` the tasks are) instead of waiting for ever.
    Setting ``cancel`` cancels the job (:class:`JobCancelled`).
    """
    check_int("workers", num_workers)
    slots = task_slots(spark)
    if slots is not None and num_workers > slots:
        log.warning(
            "%d asynchronous workers on %d task slots: they will run in waves, not all at once",
            num_workers,
            slots,
        )
    stage_id = _stage_id()

    def start() -> tuple[int, int]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        index = ctx.partitionId() if ctx is not None else 0
        return index, index

    df = _task_stage(spark, num_workers, _task_body(stage_id, start, fn), barrier=False)
    what = what or f"the {num_workers} asynchronous workers"
    return _results(
        run_watched(
            spark,
            df.collect,
            num_workers,
            description=description,
            start_timeout_s=start_timeout_s,
            need_all=False,
            too_slow=_none_started(start_timeout_s, master_of(spark), what),
            cancel=cancel,
        ),
        stage_id,
        num_workers,
    )


def _stages(sc, group: str) -> list[Any]:
    """The stage infos of ``group``'s jobs so far (a classic SparkContext's status tracker)."""
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(job_id) for job_id in tracker.getJobIdsForGroup(group)]
    stages = [tracker.getStageInfo(stage_id) for job in jobs if job for stage_id in job.stageIds]
    return [stage for stage in stages if stage]
