"""Live monitoring of real jobs on local[2]: a deliberately slowed worker is named, and the run's
records are read back with TensorBoard's and MLflow's own readers and drawn by ``report``."""

from __future__ import annotations

import json
import socket

import pytest
import torch

import sparkdp
from sparkdp.models import build_model
from sparkdp.monitor.report import load_run, write_report

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def _images(rows=4000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 1, 28, 28, generator=g)
    y = (x.mean(dim=(1, 2, 3)) > 0).long() + 2 * (x[:, 0, 0, 0] > 0).long()
    return x, y


def test_a_slowed_worker_is_named_and_the_run_reads_back_everywhere(spark, tmp_path, monkeypatch):
    # worker 1 sleeps 40 ms in every step from its 3rd on: a straggler of slow compute
    monkeypatch.setenv("SPARKDP_FAULT", "slow:rank=1:step=3:ms=40")
    x, y = _images()
    torch.manual_seed(0)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = sparkdp.fit(
        build_model("cnn-small"),
        (x, y),
        eval_data=(x[:500], y[:500]),
        workers=2,
        epochs=2,
        batch_size=32,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        tensorboard=True,
        mlflow=uri,
        metrics_interval_s=0.3,
        show_progress=False,
    )
    records = [json.loads(line) for line in (tmp_path / "run" / "run.jsonl").read_text().splitlines()]
    warnings = [r["message"] for r in records if r["type"] == "warning"]
    host = socket.gethostname()  # local[2]: both workers on this machine
    assert any(
        w.startswith(f"worker 1 on host {host} is a straggler") and "slow compute" in w for w in warnings
    ), warnings
    assert not any(w.startswith("worker 0 ") for w in warnings)
    metrics = [r for r in records if r["type"] == "metrics"]
    assert {r["rank"] for r in metrics} == {0, 1}
    last = {r["rank"]: r for r in metrics}
    assert last[0]["samples"] == last[1]["samples"] == 4000  # 2 epochs of 2000 rows each
    assert last[0]["bytes_sent"] > 0 and last[0]["rss_bytes"] > 0
    epochs = [r for r in records if r["type"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert epochs[-1]["test_accuracy"] == pytest.approx(result.history[-1]["test_accuracy"])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    accuracy = [e.value for e in events.Scalars("epoch/test_accuracy")]
    assert accuracy == pytest.approx([h["test_accuracy"] for h in result.history], abs=1e-6)
    assert "worker1/samples_per_s" in events.Tags()["scalars"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("sparkdp").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["strategy"] == "allreduce"
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert losses == pytest.approx([h["loss"] for h in result.history])

    files = write_report([load_run(tmp_path / "run")], tmp_path / "report")
    assert {f.name for f in files} >= {"loss.png", "test_accuracy.png", "system.png", "summary.md"}
    assert "| allreduce | 2 | 2/2 |" in (tmp_path / "report" / "summary.md").read_text()


def test_an_async_job_reports_staleness_and_pushes(spark, tmp_path):
    x, y = _images(2000, seed=1)
    torch.manual_seed(0)
    sparkdp.fit(
        build_model("cnn-small"),
        (x, y),
        strategy="asgd",
        workers=2,
        epochs=1,
        batch_size=32,
        spark=spark,
        run_dir=str(tmp_path),
        metrics_interval_s=0.3,
        show_progress=False,
    )
    jobs = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    jobs = [r for r in jobs if r["type"] == "job" and r.get("staleness")]
    assert jobs, "no parameter-server figures in the run log"
    # every worker pushes after every step: 2 workers x 32 steps, all counted in the histogram
    final = json.loads((tmp_path / "run.jsonl").read_text().splitlines()[-1])
    assert final["type"] == "summary"
    assert sum(jobs[-1]["staleness"].values()) <= 64 and jobs[-1]["pushes"] <= 64
