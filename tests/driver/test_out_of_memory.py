"""A worker out of memory: recognised in the worker and in Spark's words, one line that says
what the model's state needs and names fsdp, and no restart (no Spark needed)."""

from __future__ import annotations

import logging
import resource

import pytest
import torch

from sparkdp.config import JobConfig, TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.driver.controller import Controller, RestartPolicy, ScalingPolicy
from sparkdp.driver.memory_advice import explained, out_of_memory_explained
from sparkdp.errors import WorkerFailed, WorkerLost, WorkerOutOfMemory
from sparkdp.spark.worker_errors import _decode_error, encode_error, translate_error
from sparkdp.strategies import resolve_strategy
from sparkdp.train import memory
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory, resolve_loss
from tests.driver.test_controller import _Plan

pytestmark = pytest.mark.timeout(30)


def _allocation_failure() -> RuntimeError:
    """What torch's CPU allocator raises when memory runs out (a petabyte never fits)."""
    try:
        torch.empty(1 << 50, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("a petabyte was allocated")


def test_torch_and_python_allocation_failures_are_recognised_and_others_are_not():
    assert memory.is_out_of_memory(_allocation_failure())
    assert memory.is_out_of_memory(MemoryError())
    try:  # raised while handling one: the chain is followed
        try:
            raise MemoryError
        except MemoryError as inner:
            raise ValueError("decoding the batch failed") from inner
    except ValueError as outer:
        assert memory.is_out_of_memory(outer)
    assert not memory.is_out_of_memory(RuntimeError("gloo: connection closed by peer"))
    assert not memory.is_out_of_memory(ValueError("can't allocate memory"))  # not an allocator's error


def test_the_workers_limit_is_its_address_space_rlimit(monkeypatch):
    limit = 3 << 30  # what spark.executor.pyspark.memory=3g sets in a Python worker
    monkeypatch.setattr(memory.resource, "getrlimit", lambda which: (limit, limit))
    assert memory.memory_limit_bytes() == limit
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(memory.resource, "getrlimit", lambda which: unlimited)
    assert memory.memory_limit_bytes() is None or memory.memory_limit_bytes() > 0  # a cgroup's, if any


def test_a_worker_out_of_memory_reaches_the_driver_as_one_line_with_its_limit(monkeypatch):
    monkeypatch.setattr(memory.resource, "getrlimit", lambda which: (2560 << 20, 2560 << 20))
    text = encode_error(1, _allocation_failure())
    err = _decode_error(f"org.apache.spark.api.python.PythonException: RuntimeError: {text}")
    assert isinstance(err, WorkerOutOfMemory) and err.rank == 1 and err.limit_bytes == 2560 << 20
    assert str(err) == (
        "worker 1 ran out of memory (limit 2.5 GiB): the model's state (parameters, gradients, optimizer "
        "state) may not fit one worker beside its batch; strategy='fsdp' shards it over the workers "
        "(docs/guide/strategies.md)"
    )
    # other failures keep their type
    assert type(_decode_error(encode_error(0, ValueError("bad row")))) is WorkerFailed


def test_spark_words_for_a_python_worker_out_of_memory_and_the_jvms_own():
    for text in (
        "Task 2 in stage 4.0 failed: Container killed by YARN for exceeding memory limits. 5.5 GB of 5.5 GB",
        "Task 3 in stage 1.0 failed 1 times: ExecutorLostFailure (executor 3 exited): reason: OOMKilled",
        'Task 1 in stage 0.0 failed: File "pickle.py", line 12\nMemoryError',
    ):
        err = translate_error(RuntimeError(text), 4, "yarn")
        assert isinstance(err, WorkerOutOfMemory), text
        assert "ran out of memory (no limit it could read" in str(err) and "strategy='fsdp'" in str(err)
    jvm = translate_error(
        RuntimeError("Task 1 in stage 0.0 failed: java.lang.OutOfMemoryError: Java heap space"), 2, "x"
    )
    assert type(jvm) is WorkerFailed and "ran out of memory in the JVM" in str(jvm)


def test_out_of_memory_is_not_restarted(caplog):
    oom = WorkerOutOfMemory("worker 1 ran out of memory (limit 1 GiB)")
    plan = _Plan(oom)
    controller: Controller[list] = Controller(
        RestartPolicy.of(JobConfig.of(max_restarts=3)), ScalingPolicy(4)
    )
    with caplog.at_level(logging.WARNING, logger="sparkdp"), pytest.raises(WorkerOutOfMemory) as info:
        controller.run(plan)
    assert info.value is oom and len(plan.seen) == 1 and not caplog.records
    assert controller.restarts.failures[0]["cause"] == "worker 1 ran out of memory (limit 1 GiB)"
    # after a failure that was restarted, still its own line (not "failed 2 times")
    later = _Plan(WorkerLost("worker 2 died"), oom)
    controller = Controller(RestartPolicy.of(JobConfig.of(max_restarts=3)), ScalingPolicy(4))
    with pytest.raises(WorkerOutOfMemory) as info:
        controller.run(later)
    assert info.value is oom and len(later.seen) == 2


def _spec(strategy: str) -> FitSpec:
    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters: 4,004,000 bytes
    x = torch.zeros(8, 1000)
    return FitSpec(
        model=model,
        loss=resolve_loss("mse"),
        optimizer=optimizer_factory("adamw", model, lr=0.1),
        strategy=resolve_strategy(strategy),
        train=TensorData(x, x),
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=4),
    )


def test_fit_names_the_model_states_bytes_and_what_to_do():
    oom = WorkerOutOfMemory("worker 1 ran out of memory")
    oom.rank, oom.limit_bytes = 1, 1 << 30
    # weights + gradients + AdamW's two moments: 4 x 4,004,000 bytes = 16,016,000 = 15.3 MiB
    with pytest.raises(WorkerOutOfMemory) as info, out_of_memory_explained(_spec("allreduce"), 4):
        raise oom
    assert str(info.value) == (
        "worker 1 ran out of memory (limit 1 GiB): the model's state needs about 15.3 MiB per replica; "
        "strategy='fsdp' shards it over the workers (docs/guide/strategies.md)"
    )
    assert info.value.rank == 1 and info.value.limit_bytes == 1 << 30
    sgd = _spec("allreduce")
    sgd.optimizer = optimizer_factory("sgd", sgd.model, lr=0.1)  # momentum 0.9 by default: one state
    assert "about 11.5 MiB per replica" in str(explained(oom, sgd, 4))  # 3 x 4,004,000
    # already sharded: more workers, not fsdp; 16,016,000 / 4 = 4,004,000 = 3.82 MiB each
    sharded = str(explained(oom, _spec("fsdp"), 4))
    assert "under strategy='fsdp'" in sharded and "15.3 MiB, 3.82 MiB on each of 4 workers" in sharded
    assert "use more workers" in sharded
