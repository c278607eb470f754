"""GPUs as Spark schedules them: each task computes on the GPU Spark assigned it
(``TaskContext.resources()``), synchronous and asynchronous.

Spark's resource scheduling runs for real here, on a ``local-cluster`` (two executor JVMs) whose
GPU discovery script announces GPU 0 to each executor. On a machine without CUDA the workers
must then stop with an error that names the GPU Spark assigned and what to do; on a machine with
one they must train on it (the second test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyspark
import pytest
import torch

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

JOB = textwrap.dedent("""
    import json, sys
    import torch
    from torch import nn
    import sparkdp

    spark = sparkdp.session("local-cluster[2,1,1024]", conf={
        # local-cluster's Workers discover the GPUs and hand one to each executor
        "spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": sys.argv[1],
        "spark.executor.resource.gpu.amount": "1", "spark.task.resource.gpu.amount": "1",
        "spark.task.maxFailures": "1",  # the error is not transient: no retries
    })
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = (x.sum(1) > 0).long()

    out = {}
    for strategy, workers in (("allreduce", int(sys.argv[2])), ("asgd", 2)):
        try:
            result = sparkdp.fit(nn.Linear(8, 2), (x, y), eval_data=(x, y), strategy=strategy, workers=workers, epochs=2,
                                 batch_size=32, spark=spark, show_progress=False)
            out[strategy] = {"accuracy": result.test_accuracy}
        except Exception as exc:
            out[strategy] = {"error": type(exc).__name__, "message": str(exc)}
    print("RESULT " + json.dumps(out))
""")


def _run(tmp_path: Path, addresses: list[str], sync_workers: int) -> dict:
    script = tmp_path / "gpus.sh"
    script.write_text("#!/bin/sh\necho '" + json.dumps({"name": "gpu", "addresses": addresses}) + "'\n")
    script.chmod(0o755)
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", JOB, str(script), str(sync_workers)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow  # a cluster of its own with GPU resources: make test-all
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: test_training_on_spark_assigned_gpus"
)
def test_a_task_given_a_gpu_without_cuda_says_which_gpu_and_what_to_do(tmp_path):
    out = _run(tmp_path, ["0"], sync_workers=2)
    for strategy in ("allreduce", "asgd"):
        assert out[strategy].get("error") is not None, out  # no silent fall-back to the CPU
        message = out[strategy]["message"]
        assert "Spark assigned GPU 0 to this task" in message, message
        assert "cannot use CUDA" in message and "Install a CUDA build of torch" in message, message


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False): "
    "the Spark-scheduled GPU path trains only where a GPU is",
)
def test_training_on_spark_assigned_gpus(tmp_path):
    # every executor discovers GPU 0 and NCCL refuses two ranks on one GPU: the barrier job
    # runs one worker, the asynchronous one two (they share the GPU)
    out = _run(tmp_path, ["0"], sync_workers=1)
    for strategy in ("allreduce", "asgd"):
        assert "error" not in out[strategy], out
        assert out[strategy]["accuracy"] > 0.9, out


NO_EXECUTOR = textwrap.dedent("""
    import json, sys, time
    import torch
    from torch import nn
    import sparkdp

    # executors that want a GPU from Workers that have none: Spark never launches one
    spark = sparkdp.session("local-cluster[2,1,1024]", conf={
        "spark.executor.resource.gpu.amount": "1", "spark.executor.resource.gpu.discoveryScript": sys.argv[1],
        "spark.task.resource.gpu.amount": "1"})
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    out = {}
    for strategy in ("asgd", "allreduce"):
        started = time.monotonic()
        try:
            sparkdp.fit(nn.Linear(8, 2), (x, y), strategy=strategy, workers=2, epochs=1, start_timeout_s=8,
                        spark=spark, show_progress=False)
            out[strategy] = {"error": None}
        except Exception as exc:
            out[strategy] = {"error": type(exc).__name__, "message": str(exc), "s": time.monotonic() - started}
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.slow  # (make test-all) a local-cluster whose executors lack the requested GPU
def test_jobs_no_executor_can_take_stop_within_the_start_timeout(tmp_path):
    """Never a hang: tasks that no executor can hold (here: a GPU no Worker has) end in a
    RendezvousTimeout after ``start_timeout_s``, for asynchronous jobs as for barrier stages."""
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0"]}\'\n')
    script.chmod(0o755)
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, "-c", NO_EXECUTOR, str(script)],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for strategy in ("asgd", "allreduce"):
        assert out[strategy]["error"] == "RendezvousTimeout", out
        assert out[strategy]["s"] < 60, out  # 8 s of waiting, plus cancelling
    assert "did not start within 8 s" in out["asgd"]["message"], out
    assert "no executor took any of its tasks" in out["asgd"]["message"], out
    # the barrier stage: Spark's own slot check (3 tries, 2 s apart, as sparkdp sets it) or sparkdp's watchdog
    assert (
        "fewer task slots right now" in out["allreduce"]["message"]
        or "did not start them all within 8 s" in out["allreduce"]["message"]
    ), out
