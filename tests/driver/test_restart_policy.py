"""The one restart policy every runner uses, and the typed errors it reads (no Spark needed)."""

from __future__ import annotations

import logging

import pytest

from sparkdp.config import JobConfig
from sparkdp.driver.controller import RestartPolicy, ScalingPolicy
from sparkdp.errors import WorkerFailed, WorkerHung, WorkerLost
from sparkdp.spark.worker_errors import _decode_error, encode_error, translate_error

pytestmark = pytest.mark.timeout(30)


def _free(*counts: int | None) -> ScalingPolicy:
    """4 workers requested, down to 2, with ``counts`` task slots free at each look."""
    free = iter(counts)
    return ScalingPolicy(4, 2, lambda: next(free))


def test_each_failure_is_one_line_and_the_policies_shrink_and_grow_the_job(caplog):
    policy = RestartPolicy.of(JobConfig.of(max_restarts=2, pg_timeout_s=15))
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        assert policy.recover(WorkerLost("worker 3 died"), _free(3), "epoch 2, step 10") == 3
        assert (
            policy.recover(WorkerHung("worker 1 stopped making progress"), _free(1), "the start of epoch 3")
            == 2
        )
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "sparkdp: worker 3 died -- restart 1 of 2 from epoch 2, step 10 on 3 of 4 workers (task slots gone)",
        "sparkdp: worker 1 stopped making progress (after 15 s) -- restart 2 of 2 from the start of "
        "epoch 3 on 2 of 4 workers (task slots gone)",
    ]
    returned = _free(4, None)
    assert returned.workers() == 4 and returned.workers() == 4  # the slots returned, or unknown
    with pytest.raises(
        WorkerFailed,
        match=r"failed 3 times, more than max_restarts=2 allows \(1: worker 3 died; "
        r"2: worker 1 stopped .*; 3: boom\)",
    ):
        policy.recover(WorkerFailed("boom"), _free(4), "x")


def test_the_scaling_policy_reads_min_workers_from_the_job():
    job = JobConfig.of(workers=4, min_workers=3)
    assert ScalingPolicy.of(job, 4, lambda: 1).workers() == 3  # never below min_workers
    assert ScalingPolicy.of(JobConfig.of(workers=4), 4, lambda: 1).workers() == 4  # none: all of them


def test_without_min_workers_or_restarts_the_job_keeps_its_size_or_fails_with_the_cause():
    policy = RestartPolicy.of(JobConfig.of(max_restarts=0))
    assert ScalingPolicy(4, None, lambda: 1).workers() == 4  # no min_workers: wait for all of them
    lost = WorkerLost("worker 0 died")
    with pytest.raises(WorkerLost) as info:
        policy.recover(lost, ScalingPolicy(4), "x")
    assert info.value is lost


def test_a_hung_worker_reaches_the_driver_typed_and_a_killed_one_as_lost():
    text = encode_error(0, WorkerHung("worker 1 stopped making progress; worker 0 timed out waiting for it"))
    hung = _decode_error(f"org.apache.spark.api.python.PythonException: RuntimeError: {text}")
    assert isinstance(hung, WorkerHung) and hung.rank == 0
    assert str(hung) == "worker 1 stopped making progress; worker 0 timed out waiting for it"
    other = _decode_error(encode_error(2, ValueError("bad row")))
    assert type(other) is WorkerFailed and other.rank == 2
    killed = translate_error(
        RuntimeError("Task 1 in stage 3.0 failed: Python worker exited unexpectedly (crashed)"), 2, "local[2]"
    )
    assert isinstance(killed, WorkerLost) and str(killed).startswith("worker 1 died")


def test_spark_connect_cancel_and_message_size_errors_become_sparkdp_messages():
    from sparkdp.errors import ConfigError

    cancelled = translate_error(
        RuntimeError(
            "(org.apache.spark.SparkException) [OPERATION_CANCELED] Operation "
            "has been cancelled. SQLSTATE: HY008"
        ),
        2,
        "local[2]",
    )
    assert (
        type(cancelled) is WorkerFailed
        and "was cancelled" in str(cancelled)
        and "stays usable" in str(cancelled)
    )
    big = translate_error(
        RuntimeError(
            "<_MultiThreadedRendezvous of RPC that terminated with: status = "
            'StatusCode.RESOURCE_EXHAUSTED details = "CLIENT: Sent message larger than '
            'max (157287896 vs. 134217728)">'
        ),
        2,
        "local[2]",
    )
    assert isinstance(big, ConfigError) and "(150 MiB, the limit is 128 MiB)" in str(big)
    assert "DataFrame or a Parquet path" in str(big)
