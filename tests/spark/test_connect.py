"""The same small jobs on a classic session and on a Spark Connect session: sparkdp's stages are
DataFrame stages (``mapInArrow``) either way, so sync and async fit, DataFrame input, ``run``,
``launch``, ``predict``, the Spark ML Estimator, checkpoints with automatic recovery and the
command line must give the same results on both."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import sparkdp
from sparkdp.spark.cluster import is_connect

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _connect_available() -> str | None:
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except Exception as exc:  # noqa: BLE001 - the connect extra is not installed
        return f"the Spark Connect client's dependencies are missing (pip install 'sparkdp[connect]'): {exc}"
    return None


@pytest.fixture(scope="module", params=["classic", "connect"])
def session(request):
    """The shared classic local[2,4] session, or a Connect client to a local[2,4] Connect server."""
    if request.param == "classic":
        yield request.getfixturevalue("spark")
        return
    missing = _connect_available()
    if missing:
        pytest.skip(missing)
    from tests.helpers.connect import ConnectServer

    with ConnectServer("local[2,4]") as url:
        remote = sparkdp.session(remote=url)
        try:
            assert is_connect(remote)
            yield remote
        finally:
            remote.stop()
            # the client marks the whole process as "Connect mode"; the classic session comes back after it
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def _problem(rows=192, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5, 1.5]) > 0).long()
    torch.manual_seed(0)
    return nn.Linear(4, 2), x, y


@pytest.mark.parametrize("strategy", ["allreduce", "hogwild"])
def test_fit_on_arrays(session, strategy):
    model, x, y = _problem()
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        strategy=strategy,
        workers=2,
        epochs=2,
        batch_size=8,
        optimizer="sgd",
        optimizer_options={"lr": 0.2},
        spark=session,
        show_progress=False,
    )
    assert result.workers == 2 and len(result.history) == 2
    assert result.test_accuracy is not None and result.test_accuracy > 0.8, result.test_accuracy


def test_fit_on_a_dataframe(session):
    x = np.random.default_rng(0).normal(size=(600, 3)).astype(np.float32)
    w = np.array([1.5, -2.0, 0.5], np.float32)
    y = x @ w + 0.3
    df = session.createDataFrame(
        [(*map(float, row), float(t)) for row, t in zip(x, y, strict=True)], ["a", "b", "c", "y"]
    ).repartition(2)
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    result = sparkdp.fit(
        model,
        df,
        features=["a", "b", "c"],
        label="y",
        loss=lambda out, t: nn.functional.mse_loss(out.squeeze(1), t),
        workers=2,
        epochs=3,
        batch_size=16,
        optimizer_options={"lr": 0.05},
        spark=session,
        show_progress=False,
    )
    assert [h["samples"] for h in result.history] == [600] * 3
    np.testing.assert_allclose(model.weight.detach().numpy()[0], w, atol=0.1)


def test_a_killed_worker_restarts_from_its_checkpoint_and_ends_where_an_uninterrupted_run_does(
    session, tmp_path, monkeypatch
):
    """Checkpoints and automatic recovery: worker 1 killed at step 30 of 48, the stage restarts
    from the step-20 checkpoint, and the weights equal an uninterrupted run's."""

    def fit(**kw):
        model, x, y = _problem()
        result = sparkdp.fit(
            model,
            (x, y),
            strategy="allreduce",
            workers=2,
            epochs=2,
            batch_size=8,
            optimizer="sgd",
            optimizer_options={"lr": 0.2},
            spark=session,
            show_progress=False,
            **kw,
        )
        return model, result

    clean, _ = fit()
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=18")  # 12 steps per epoch
    model, result = fit(checkpoint_dir=str(tmp_path), checkpoint_every=5)
    [failure] = result.details["restarts"]
    assert failure["restart_from"] == "epoch 2, step 5", failure
    assert [h["epoch"] for h in result.history] == [1, 2]
    for p, q in zip(model.parameters(), clean.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def _train_on(master: str, summary: Path):
    import subprocess
    import sys

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkdp.cli.main",
            "train",
            "--master",
            master,
            "--dataset",
            "fashion-mnist",
            "--limit",
            "1000",
            "--model",
            "linear",
            "--workers",
            "2",
            "--epochs",
            "1",
            "--json-out",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )


def test_the_command_line_trains_through_a_connect_server(session, tmp_path):
    """``sparkdp train --master sc://...`` is a Connect client."""
    from sparkdp.spark.cluster import connect_server

    server = connect_server(session)
    if server is None:  # the classic kind: test_the_command_line_trains_on_a_classic_master_of_its_own
        pytest.skip("a classic session has no Connect server to point the command line at")
    summary = tmp_path / "summary.json"
    proc = _train_on(f"sc://{server[0]}:{server[1]}", summary)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(summary.read_text())
    assert data["workers"] == 2 and data["test_accuracy"] > 0.5, data


@pytest.mark.slow  # (make test-all) tests/cli/test_cli.py's built-in job is a classic driver of its own in make test
def test_the_command_line_trains_on_a_classic_master_of_its_own(tmp_path):
    """``sparkdp train --master local[2]`` starts a classic driver of its own."""
    summary = tmp_path / "summary.json"
    proc = _train_on("local[2]", summary)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(summary.read_text())
    assert data["workers"] == 2 and data["test_accuracy"] > 0.5, data


def _ranks(times):
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "times": times}


def test_run_a_function_of_the_users_own(session):
    assert sparkdp.run(_ranks, 3, workers=2, spark=session) == {"rank": 0, "world": 2, "sum": 3.0, "times": 3}


def test_launch_a_script(session, tmp_path):
    out = tmp_path / "spark.json"
    sparkdp.launch(SCRIPTS / "argparse_main.py", "--epochs", "1", "--out", str(out), workers=2, spark=session)
    result = json.loads(out.read_text())
    assert result["accuracy"] > 0.7 and result["keys"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]


def test_predict_matches_local_torch(session):
    x = np.random.default_rng(0).normal(size=(60, 4))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    df = session.createDataFrame(
        [(i, row.tolist()) for i, row in enumerate(x)], "id long, features array<double>"
    )
    out = sparkdp.predict(model, df.repartition(2), features="features").orderBy("id").toPandas()
    with torch.no_grad():
        expected = model(torch.from_numpy(x).float()).argmax(1).tolist()
    assert out["prediction"].tolist() == expected


def test_estimator_fit_and_transform(session):
    from sparkdp.ml import Estimator, Model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    y = (x @ np.array([1.0, -2.0, 0.5, 1.5]) > 0).astype(int)
    df = session.createDataFrame(
        [(i, row.tolist(), int(t)) for i, (row, t) in enumerate(zip(x, y, strict=True))],
        "id long, features array<double>, label long",
    )
    est = Estimator(
        model="linear",
        modelKwargs=json.dumps({"image_size": 2, "num_classes": 2}),
        featureShape=[1, 2, 2],
        epochs=2,
        workers=2,
        batchSize=16,
        learningRate=0.1,
    )
    fitted = est.fit(df)
    assert isinstance(fitted, Model)
    scored = fitted.transform(df).orderBy("id").toPandas()
    accuracy = (scored["prediction"] == scored["label"]).mean()
    assert accuracy > 0.85, accuracy


def _sleep(seconds):
    time.sleep(seconds)
    return seconds


def test_ctrl_c_cancels_the_tasks_and_the_session_stays_usable(session):
    """A KeyboardInterrupt in the calling thread (Ctrl-C, a notebook's 'interrupt kernel') while
    sparkdp waits for the job cancels the job's Spark tasks; the same session then runs a job
    that needs both task slots again."""
    import _thread

    timer = threading.Timer(6.0, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            sparkdp.run(_sleep, 120, workers=2, spark=session)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 30
    again = time.monotonic()
    assert sparkdp.run(_ranks, 1, workers=2, spark=session, start_timeout_s=60)["sum"] == 3.0
    # the sleeping tasks were cancelled: their slots were free long before they would have woken
    assert time.monotonic() - again < 60
