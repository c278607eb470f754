"""A task result of a few hundred MB (a trained model's whole state, returned by rank 0) reaches
the driver on an embedded session, and one that cannot gets an error naming the setting to raise."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError, WorkerFailed
from sparkdp.spark.session import LOCAL_DRIVER_MEMORY_MIB, local_driver_memory
from sparkdp.spark.worker_errors import translate_error

GIB = 1 << 30

# What Spark 4 said on a local[2] session with its default 1g heap when a fit's rank 0 returned
# a 118 MB model state, and when results outgrow spark.driver.maxResultSize
_UNREAD = (
    "An error occurred while calling o123.collectToPython.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Exception while getting "
    "task result: java.lang.IllegalStateException: unread block data\n"
    "\tat java.base/java.io.ObjectInputStream$BlockDataInputStream.setBlockDataMode"
)
_MAX_RESULT = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Total size of serialized "
    "results of 1 tasks (1100.3 MiB) is bigger than spark.driver.maxResultSize (1024.0 MiB)"
)


def test_a_large_result_travels_in_parts_and_is_rebuilt_whole(monkeypatch):
    """No row carries more than RESULT_PART_BYTES (the driver's JVM copies each row whole), the parts
    come back in any order, and a lost part is reported as the driver's heap, not as foreign data."""
    from sparkdp.spark import launcher

    monkeypatch.setattr(launcher, "RESULT_PART_BYTES", 4096)
    state = {"w": torch.arange(10_000, dtype=torch.int32), "loss": 0.25}
    rows = launcher._result_batch("stage", 0, state).to_pylist()
    assert len(rows) == 10 and all(len(row["result"]) <= 4096 for row in rows)
    assert {row["parts"] for row in rows} == {len(rows)}
    (back,) = launcher._results(rows[::-1], "stage", 1)
    assert torch.equal(back["w"], state["w"]) and back["loss"] == 0.25
    with pytest.raises(WorkerFailed, match=r"whole results of tasks \[\] .*raise spark\.driver\.memory"):
        launcher._results(rows[:3] + rows[4:], "stage", 1)
    with pytest.raises(WorkerFailed, match="repeated or extra parts"):
        launcher._results(rows + rows[2:3], "stage", 1)


def test_an_embedded_session_gets_a_quarter_of_the_memory_within_bounds():
    low, high = LOCAL_DRIVER_MEMORY_MIB
    assert local_driver_memory(2 * GIB) == f"{low}m"  # a small machine: Spark's own 1g
    assert local_driver_memory(8 * GIB) == "2048m"
    assert local_driver_memory(64 * GIB) == f"{high}m"
    assert local_driver_memory(0) == f"{low}m"  # memory unknown


def test_the_embedded_sessions_jvm_has_that_heap(spark):
    """Spark's default 1g heap cannot pass a result of a few hundred MB to Python."""
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    wanted = int(local_driver_memory()[:-1]) << 20
    assert heap >= 0.85 * wanted, (heap >> 20, wanted >> 20)  # the JVM reports a little less than -Xmx


@pytest.mark.parametrize("master", ["local[2]", "spark://host:7077"])
def test_unread_block_data_names_the_drivers_memory(master):
    err = translate_error(RuntimeError(_UNREAD), 2, master)
    assert isinstance(err, ConfigError)
    assert "spark.driver.memory" in str(err) and "unread block data" in str(err)


def test_a_local_jvm_out_of_memory_is_the_drivers():
    text = "Job aborted: java.lang.OutOfMemoryError: Java heap space"
    local = translate_error(RuntimeError(text), 1, "local[2]")
    assert isinstance(local, ConfigError) and "spark.driver.memory" in str(local)
    cluster = translate_error(RuntimeError(text), 1, "spark://host:7077")  # an executor's own heap there
    assert isinstance(cluster, WorkerFailed) and "spark.executor.memory" in str(cluster)


def test_results_over_max_result_size_name_the_setting_and_sizes():
    err = translate_error(RuntimeError(_MAX_RESULT), 1, "local[2]")
    assert isinstance(err, ConfigError)
    assert "spark.driver.maxResultSize (1100.3 MiB, the limit is 1024.0 MiB)" in str(err)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_300_mb_result_reaches_the_driver(spark):
    """Rank 0's result as large as a ~75M-parameter model's fp32 state: Spark's default 1g driver
    heap lost it (an OutOfMemoryError in the JVM; no rows came back)."""
    from sparkdp.spark.launcher import run_barrier

    numel = 300 * (1 << 20) // 4

    def big(_info):
        return {"w": torch.arange(numel, dtype=torch.int32)}

    result = run_barrier(big, 1, spark=spark, store=False)[0]["w"]
    assert result.numel() == numel and result[-1].item() == numel - 1 and result[12345].item() == 12345
