"""Spark decommissions one of the Workers a synchronous job runs on (a real standalone cluster,
spark.decommission.enabled, SIGPWR to the Worker): the driver sees it, the workers save at the
step they agree on and stop, and the job continues from there on the Workers left -- a
preemption, which max_restarts=0 does not stop."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.standalone import StandaloneCluster

from .test_cli import needs_fashion

# a standalone cluster of three Workers and two attempts of a job: behind `make test-all`
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.timeout(400),
]

STEPS = 47  # 6,000 rows / 2 workers / 64 a batch

JOB = textwrap.dedent("""
    import json, logging, sys
    import torch
    import sparkdp
    from sparkdp.data.datasets import dataset_tensors, load_dataset
    from sparkdp.models import build_model

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    spark = sparkdp.session(sys.argv[1], conf={"spark.decommission.enabled": "true",
                                                "spark.executor.cores": "1", "spark.executor.memory": "1g"})
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=6000))
    torch.manual_seed(0)
    result = sparkdp.fit(build_model("cnn-small"), train, eval_data=test, workers=2, epochs=4, batch_size=64,
                         spark=spark, show_progress=False, checkpoint_dir=sys.argv[2], run_dir=sys.argv[3],
                         max_restarts=0, metrics_interval_s=0.5)
    print("RESULT " + json.dumps({"history": result.history, "preemptions": result.details["preemptions"],
                                  "restarts": result.details["restarts"], "accuracy": result.test_accuracy}))
    spark.stop()
""")


def _progress(run_dir: Path) -> int:
    """The furthest step rank 0 has reported (over the epochs), 0 before any."""
    furthest = 0
    for f in run_dir.glob("**/*.jsonl"):
        for line in f.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written
            if record.get("type") == "metrics" and record.get("rank") == 0 and record.get("step"):
                furthest = max(furthest, (record["epoch"] - 1) * STEPS + record["step"])
    return furthest


@needs_fashion
def test_a_decommissioned_worker_saves_and_the_job_moves_to_the_workers_left(tmp_path):
    (tmp_path / "cluster").mkdir()
    ckpt, run_dir, err = tmp_path / "ckpt", tmp_path / "run", tmp_path / "stderr.txt"
    cluster = StandaloneCluster(
        tmp_path / "cluster", workers=3, cores=1, worker_opts="-Dspark.decommission.enabled=true"
    ).start()
    try:
        with open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", JOB, cluster.master_url, str(ckpt), str(run_dir)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=cluster.env(),
                text=True,
            )
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None and _progress(run_dir) < 20:
                time.sleep(0.2)
            assert proc.poll() is None, err.read_text()[-3000:]
            # a Worker whose executor runs a training task: its Python daemon has forked a worker
            busy = next(i for i in range(3) if len(cluster.worker_processes(i)) >= 3)
            seen = _progress(run_dir)  # rank 0 was at least this far when the Worker was told
            cluster.decommission_worker(busy)
            out, _ = proc.communicate(timeout=300)
    finally:
        cluster.stop()
    text = err.read_text()
    assert proc.returncode == 0, text[-3000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    [preemption] = result["preemptions"]
    assert result["restarts"] == []  # max_restarts=0, and the job went on
    epoch, step = (int(n) for n in preemption["restart_from"].removeprefix("epoch ").split(", step "))
    assert (epoch - 1) * STEPS + step >= seen  # nothing trained before the notice was lost
    lines = [ln for ln in text.splitlines() if ln.startswith("sparkdp: ")]
    assert any(
        "is decommissioning: asking the workers to save a checkpoint and stop" in ln for ln in lines
    ), lines
    assert any(f"-- preemption 1, restart from {preemption['restart_from']}" in ln for ln in lines), lines
    assert any(ln.startswith("sparkdp: recovered from preemption 1") for ln in lines), lines
    assert [h["epoch"] for h in result["history"]] == [1, 2, 3, 4]
    assert result["accuracy"] > 0.6
