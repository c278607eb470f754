"""The barrier launcher on a real local[2] Spark."""

import os
import threading
import time

import pytest

from sparkdp.errors import ConfigError, EnvironmentProblem, RendezvousTimeout, WorkerFailed
from sparkdp.spark.cluster import task_slots
from sparkdp.spark.launcher import run_barrier, run_tasks
from sparkdp.spark.task import listening_store
from sparkdp.spark.warm_up import THREAD_NAME
from sparkdp.spark.worker_preload import PRELOAD_ENV

pytestmark = pytest.mark.spark


def _rank_and_world(info):
    p = info.placement
    return (
        info.rank,
        info.world_size,
        info.master_addr,
        info.master_port > 0,
        (p.rank, p.local_rank, p.local_world_size, p.group_rank, p.group_world_size),
        info.run_id,
        info.attempt,
    )


def test_the_last_task_to_arrive_leaves_the_rendezvous_at_once(spark):
    """On a local master the tasks meet on the driver's board: the last to arrive waits only for
    its answer (Spark's barrier allGather holds every task for a second at least)."""
    waits = run_barrier(lambda info: info.rendezvous_s, 2, spark=spark)
    assert min(waits) < 0.5, waits


def test_every_rank_runs_and_agrees_on_the_rendezvous(spark):
    results = run_barrier(_rank_and_world, 2, spark=spark)
    assert [r[:2] for r in results] == [(0, 2), (1, 2)]
    assert results[0][2] == results[1][2] and all(r[3] for r in results)
    # local[2]: both ranks on one host, LOCAL_RANK 0 and 1 (torchrun's terms), one stage's first attempt
    assert [r[4] for r in results] == [(0, 0, 2, 0, 1), (1, 1, 2, 0, 1)]
    assert results[0][5] == results[1][5] and results[0][5].startswith("spark-stage-")
    assert [r[6] for r in results] == [0, 0]


def test_the_rendezvous_store_listens_on_the_task_address_only():
    import psutil
    from torch.distributed import TCPStore

    def listening(port):
        return [
            c.laddr
            for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port
        ]

    store = listening_store("127.0.0.1", 2)
    port = store.port
    assert listening(port) and all(addr.ip == "127.0.0.1" for addr in listening(port))
    client = TCPStore("127.0.0.1", port, 2, is_master=False)
    client.set("rank1", b"ready")
    assert store.get("rank1") == b"ready"
    del client, store
    assert not listening(port)


def test_the_session_warms_up_the_worker_daemon(spark):
    assert spark.sparkContext.statusTracker().getJobIdsForGroup("sparkdp-warm-up")


def _daemon_pid(_index):
    return os.getppid()  # a worker is forked by its daemon


def test_the_stages_fork_their_workers_from_the_daemon_the_warm_up_started(spark):
    """Spark keeps one daemon per task environment: had the warm-up's differed from a stage's,
    the stage's workers would fork from a second plain sparkdp daemon, started after the
    warm-up's, and the first stage would wait for torch's import. (Jobs of other tests on this
    session may have started daemons of their own since: the warm-up's is the oldest.)"""
    import psutil

    for thread in threading.enumerate():
        if thread.name == THREAD_NAME:
            thread.join(60)
    daemon = run_tasks(_daemon_pid, 1, spark=spark)[0]
    jvm = psutil.Process(daemon).parent()

    def plain_daemon(process):
        try:
            return "sparkdp.spark.daemon" in process.cmdline() and PRELOAD_ENV not in process.environ()
        except psutil.Error:  # a child that has ended meanwhile
            return False

    oldest = min((p for p in jvm.children() if plain_daemon(p)), key=lambda p: p.create_time())
    assert oldest.pid == daemon
    assert "SPARK_SIMPLIFIED_TRACEBACK" not in spark.sparkContext.environment  # the warm-up's own only


def test_too_many_workers_fails_fast_with_advice(spark):
    assert task_slots(spark.sparkContext) == 2
    started = time.monotonic()
    with pytest.raises(
        RendezvousTimeout, match=r"requested 4 workers.*at most 2 tasks at once.*workers <= 2"
    ):
        run_barrier(_rank_and_world, 4, spark=spark)
    assert time.monotonic() - started < 5


def _fail_on_rank_one(info):
    if info.rank == 1:
        raise ValueError("bad shard on purpose")
    return info.rank


def test_a_worker_error_reaches_the_driver_readably(spark):
    with pytest.raises(WorkerFailed, match=r"worker 1 failed: ValueError: bad shard on purpose"):
        run_barrier(_fail_on_rank_one, 2, spark=spark)


def _config_error(info):
    raise ConfigError("labels out of range, fix them")


def test_sparkdp_errors_keep_their_type(spark):
    with pytest.raises(ConfigError, match="labels out of range"):
        run_barrier(_config_error, 2, spark=spark)


@pytest.mark.parametrize("workers", [0, -1, 1.5])
def test_bad_worker_counts(spark, workers):
    with pytest.raises(ConfigError, match="workers must be a positive integer"):
        run_barrier(_rank_and_world, workers, spark=spark)


def test_a_module_the_executors_lack_is_named_with_what_to_do(spark, tmp_path, monkeypatch):
    """The peers' most common failure: the task's pickle names a module only the driver has."""
    import importlib

    (tmp_path / "driver_only_helpers.py").write_text("def work(info):\n    return info.rank\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the driver finds it; the executors' Python does not
    helpers = importlib.import_module("driver_only_helpers")
    with pytest.raises(EnvironmentProblem) as caught:
        run_barrier(helpers.work, 1, spark=spark)
    message = str(caught.value)
    assert "could not import 'driver_only_helpers'" in message, message
    assert "spark.archives=env.tar.gz#env" in message and "--py-files" in message


def test_an_unreachable_driver_address_fails_fast_and_names_it(spark):
    import socket

    from sparkdp.spark.launcher import check_reachable

    with socket.create_server(("127.0.0.1", 0)) as listening:  # reachable: returns quietly
        check_reachable(spark, f"127.0.0.1:{listening.getsockname()[1]}")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(
        EnvironmentProblem,
        match=rf"cannot reach the parameter server on the driver at "
        rf"127.0.0.1:{closed} within 5 s .*spark.driver.host",
    ):
        check_reachable(spark, f"127.0.0.1:{closed}")
    assert time.monotonic() - started < 30


def test_dynamic_allocation_is_explained_before_a_barrier_stage():
    from sparkdp.spark.cluster import barrier_refusal

    assert barrier_refusal({"spark.master": "yarn"}) is None
    assert barrier_refusal({"spark.dynamicAllocation.enabled": "false"}) is None
    message = barrier_refusal({"spark.dynamicAllocation.enabled": "True"})
    assert "does not allow with dynamic allocation" in message and "strategy='asgd'" in message


def _closure_values(fn, seen=None):
    """Everything a shipped task function carries in its closure, nested closures included:
    what anyone who sees the task (an executor, a Connect server, a sniffer) can read."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    out = []
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        out.append(value)
        if callable(value):
            out += _closure_values(value, seen)
    return out


def test_a_result_forged_with_everything_in_the_task_closure_runs_nothing_on_the_driver(
    spark, tmp_path, monkeypatch
):
    """An attacker who sees the task the driver ships reads every value in its closure, seals a
    pickle with any key found there that would create a file when
    unpickled, and puts it in the result column. The driver refuses it and runs nothing."""
    import hashlib
    import hmac
    import pickle
    from types import SimpleNamespace

    from sparkdp.spark import launcher

    marker = tmp_path / "the driver ran the attacker's code"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Exploit())

    def forged_stage(spark_, num_tasks, body, *, barrier):
        keys = [v for v in _closure_values(body) if isinstance(v, bytes)] or [b"no key in the closure"]
        cells = [
            hmac.new(key, (0).to_bytes(8, "big", signed=True) + payload, hashlib.sha256).digest() + payload
            for key in keys
        ]
        return SimpleNamespace(collect=lambda: [{"index": 0, "part": 0, "parts": 1, "result": cells[0]}])

    monkeypatch.setattr(launcher, "_task_stage", forged_stage)
    with pytest.raises(
        WorkerFailed, match="the result of task 0 was not read: it is not a sparkdp task result"
    ):
        run_barrier(_rank_and_world, 1, spark=spark)
    assert not marker.exists()


def test_stage_results_are_read_only_as_their_own_tasks_results():
    """A result cell is read only as the result of its own stage and task: another stage's,
    another index's, a damaged cell or missing and extra rows are refused."""
    from sparkdp.spark.launcher import _result_batch, _results, _stage_id

    stage = _stage_id()
    rows = [
        batch.to_pylist()[0] for batch in (_result_batch(stage, 1, {"b": 2}), _result_batch(stage, 0, [1]))
    ]
    assert _results(rows, stage, 2) == [[1], {"b": 2}]  # in task order
    cell = rows[0]["result"]
    with pytest.raises(
        WorkerFailed, match=r"result of task 0 was not read: it is the result of task 1 of stage"
    ):
        _results([{**rows[0], "index": 0}, {**rows[1], "index": 1}], stage, 2)  # swapped
    with pytest.raises(
        WorkerFailed, match=r"result of task 0 was not read: it is the result of task 0 of stage"
    ):
        _results(rows, _stage_id(), 2)
    with pytest.raises(WorkerFailed, match=r"result of task 1 was not read: it is not a sparkdp task result"):
        _results([rows[1], {**rows[0], "result": cell[:-7]}], stage, 2)
    with pytest.raises(
        WorkerFailed, match=r"received the whole results of tasks \[0\] of the stage's 2 task"
    ):
        _results(rows[1:], stage, 2)
    with pytest.raises(
        WorkerFailed, match=r"returned results for tasks \[0, 1\] with repeated or extra parts"
    ):
        _results(rows + rows[1:], stage, 2)
