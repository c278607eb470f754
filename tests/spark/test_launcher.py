"""The barrier launcher on a real local[2] Spark."""

import time

import pytest

from sparkdp.errors import ConfigError, EnvironmentProblem, RendezvousTimeout, WorkerFailed
from sparkdp.spark.cluster import task_slots
from sparkdp.spark.launcher import run_barrier
from sparkdp.spark.task import listening_store

pytestmark = pytest.mark.spark


def _rank_and_world(info):
    p = info.placement
    return (info.rank, info.world_size, info.master_addr, info.master_port > 0,
            (p.rank, p.local_rank, p.local_world_size, p.group_rank, p.group_world_size), info.run_id, info.attempt)


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
        return [c.laddr for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN
                and c.laddr.port == port]

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


def test_too_many_workers_fails_fast_with_advice(spark):
    assert task_slots(spark.sparkContext) == 2
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=r"requested 4 workers.*at most 2 tasks at once.*workers <= 2"):
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
    with pytest.raises(EnvironmentProblem, match=rf"cannot reach the parameter server on the driver at "
                                                 rf"127.0.0.1:{closed} within 5 s .*spark.driver.host"):
        check_reachable(spark, f"127.0.0.1:{closed}")
    assert time.monotonic() - started < 30


def test_dynamic_allocation_is_explained_before_a_barrier_stage():
    from sparkdp.spark.cluster import barrier_refusal

    assert barrier_refusal({"spark.master": "yarn"}) is None
    assert barrier_refusal({"spark.dynamicAllocation.enabled": "false"}) is None
    message = barrier_refusal({"spark.dynamicAllocation.enabled": "True"})
    assert "does not allow with dynamic allocation" in message and "strategy='asgd'" in message


def test_stage_results_are_unpickled_only_under_the_stages_seal():
    """A result cell is read only when its HMAC checks under the stage's own key: changed bytes,
    another stage's key or an unsealed pickle are refused before anything is unpickled."""
    from sparkdp.errors import WorkerFailed
    from sparkdp.spark.launcher import _result_batch, _results, _stage_key

    key = _stage_key()
    rows = [batch.to_pylist()[0] for batch in (_result_batch(key, 1, {"b": 2}), _result_batch(key, 0, [1]))]
    assert _results(rows, key) == [[1], {"b": 2}]  # in task order
    cell = rows[0]["result"]
    changed = [{**rows[0], "result": cell[:-2] + bytes([cell[-2] ^ 1]) + cell[-1:]}]  # one bit of the pickle
    moved = [{**rows[0], "index": 5}]
    import pickle

    unsealed = [{"index": 0, "result": pickle.dumps("x")}]
    for bad, with_key in ((changed, key), (moved, key), (rows, _stage_key()), (unsealed, key)):
        with pytest.raises(WorkerFailed, match="does not carry this job's seal"):
            _results(bad, with_key)
