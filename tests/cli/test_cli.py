"""The sparkdp command line, run as a user would: as ``sparkdp`` in a subprocess with a timeout,
or, where the test needs no process of its own, through ``sparkdp.cli.main.main`` in the one
interpreter that runs every such test's command lines (``@pytest.mark.cli``, tests/cli/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch

import sparkdp as sparkdp_package

from .conftest import Cli

SPARKDP = [sys.executable, "-m", "sparkdp.cli.main"]
FASHION = Path("/usr/share/datasets/fashion-mnist")
needs_fashion = pytest.mark.skipif(not FASHION.is_dir(), reason="dataset-fashion-mnist is not installed")


def sparkdp(
    *args: str, timeout: float = 240, env: dict | None = None, cwd=None
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*SPARKDP, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    return proc


def _explain(proc) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _builtin_job(tmp: Path) -> Cli:
    return Cli(
        [
            "train",
            "--dataset",
            "fashion-mnist",
            "--model",
            "linear",
            "--limit",
            "2000",
            "--workers",
            "2",
            "--epochs",
            "1",
            "--out",
            str(tmp / "out"),
            "--json-out",
            str(tmp / "summary.json"),
            "--quiet",
        ]
    )


@pytest.mark.e2e
@needs_fashion
@pytest.mark.cli(build=_builtin_job)
def test_builtin_job_writes_model_and_stable_json_summary(cli, tmp_path):
    (proc,) = cli.procs
    out, summary = cli.tmp / "out", cli.tmp / "summary.json"
    assert proc.returncode == 0, _explain(proc)
    data = json.loads(summary.read_text())
    final = data["history"][-1]
    # --quiet keeps the one final result line, the last epoch's figures, and nothing else
    assert proc.stdout == (
        f"final: loss {final['loss']:.4f}  test_loss {final['test_loss']:.4f}  "
        f"test_accuracy {final['test_accuracy']:.4f}\n"
    ), _explain(proc)
    for key in ("strategy", "workers", "epochs", "test_accuracy", "wall_s", "samples_per_s", "model_path"):
        assert key in data, f"missing {key} in {data}"
    assert data["strategy"] == "allreduce" and data["workers"] == 2 and data["epochs"] == 1
    assert 0.5 < data["test_accuracy"] <= 1.0 and data["samples_per_s"] > 0 and data["wall_s"] > 0
    state = safetensors.torch.load_file(data["model_path"])
    assert state["1.weight"].shape == (10, 784)
    assert json.loads((out / "model.json").read_text())["model"] == "linear"
    # the run log: header, both workers' metrics, the epoch, the summary; `report` draws it, also
    # when a crash cut its last line short
    records = [json.loads(line) for line in (out / "run.jsonl").read_text().splitlines()]
    assert records[0]["type"] == "header" and records[-1]["type"] == "summary"
    assert {r["rank"] for r in records if r["type"] == "metrics"} == {0, 1}
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    text = (out / "run.jsonl").read_text()
    (crashed / "run.jsonl").write_text(text[: text.rindex('{"type": "summary"') + 20])
    from sparkdp.cli.main import main

    # in this process: the job above already ran the command line
    assert main(["report", str(out), str(crashed), "--out", str(tmp_path / "report")]) == 0
    table = (tmp_path / "report" / "summary.md").read_text()
    assert "| out | allreduce | 2 | 1/1 |" in table and "| crashed | allreduce | 2 | 1/1 |" in table
    assert "| incomplete |" in table and "| finished |" in table
    assert (tmp_path / "report" / "loss.png").stat().st_size > 10_000


SCRIPT = """
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(256, 3)
y = (x.sum(1) > 0).long()
model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
loss_fn = nn.CrossEntropyLoss()
train_data = torch.utils.data.TensorDataset(x, y)
test_data = (x, y)
batch_size = 16

if __name__ == "__main__":   # the single-machine loop; sparkdp does not run this part
    raise SystemExit("sparkdp must not execute the script's main block")
"""


def _user_script_job(tmp: Path) -> Cli:
    script = tmp / "train_me.py"
    script.write_text(SCRIPT)
    return Cli(
        [
            "train",
            str(script),
            "--workers",
            "2",
            "--epochs",
            "3",
            "--strategy",
            "average",
            "--strategy-option",
            "period=2",
            "--json-out",
            str(tmp / "s.json"),
        ]
    )


@pytest.mark.e2e
@pytest.mark.cli(build=_user_script_job)
def test_unmodified_user_script_trains_distributed(cli):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    data = json.loads((cli.tmp / "s.json").read_text())
    assert data["strategy"] == "average" and data["test_accuracy"] > 0.9, data


def _bad_input_job(tmp: Path, args: list[str], message: str) -> Cli:
    return Cli(["train", *args, "--limit", "100"], master=None, cwd=tmp, timeout=120)


@pytest.mark.e2e
@pytest.mark.cli(build=_bad_input_job)
@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--model", "linear", "--dataset", "fashion-mnist", "--master", "spark://127.0.0.1:9"],
            "Cannot reach the Spark master 'spark://127.0.0.1:9'",
        ),
        (["missing_script.py"], "training script 'missing_script.py' does not exist"),
    ],
)
def test_bad_input_gets_one_readable_error(args, message, cli):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr, _explain(proc)
    assert "Traceback" not in proc.stderr and "at org.apache" not in proc.stderr


@needs_fashion
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--model", "resnet9000"],
            "Unknown model 'resnet9000'. Available: cnn, cnn-small, gpt, gpt-tiny, linear, mlp",
        ),
        (["--strategy", "ring"], "Unknown strategy 'ring'. Available: allreduce, asgd, average, dcasgd"),
        (["--workers", "0"], "workers must be a positive integer"),
        (["--batch-size", "0"], "batch_size must be a positive integer"),
        (["--epochs", "0"], "epochs must be a positive integer"),
        (["--out", "{tmp}/file/run"], "cannot write the run log"),
    ],
)
def test_bad_settings_or_an_unwritable_output_fail_before_spark_starts(
    args, message, tmp_path, monkeypatch, capsys
):
    from sparkdp.cli.main import main

    (tmp_path / "file").write_text("")  # a file where the output directory's parent should be

    def no_spark(*args, **kwargs):
        raise AssertionError("the command started Spark before refusing its bad input")

    monkeypatch.setattr(sparkdp_package, "session", no_spark)
    argv = ["train", "--dataset", "fashion-mnist", "--model", "linear", "--limit", "100"]
    code = main([*argv, *(a.format(tmp=tmp_path) for a in args)])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err, err


@pytest.mark.e2e
@pytest.mark.cli(
    build=lambda tmp: Cli(
        ["train", "--dataset", "fashion-mnist", "--model", "linear"],
        master=None,
        env={"SPARKDP_FASHION_MNIST": str(tmp / "nowhere")},
        timeout=120,
    )
)
def test_missing_dataset_says_how_to_install_it(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2 and "apt-get install -y dataset-fashion-mnist" in proc.stderr, _explain(proc)


@pytest.mark.e2e
@pytest.mark.cli(
    build=lambda tmp: Cli(
        ["train", "--dataset", "fashion-mnist", "--model", "linear", "--limit", "100"],
        master=None,
        env={"JAVA_HOME": str(tmp / "no-jdk"), "PATH": str(tmp)},
        timeout=120,
    )
)
def test_no_java_is_reported_with_the_fix(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2 and "needs Java 17 or newer" in proc.stderr, _explain(proc)
    assert "openjdk-17-jre-headless" in proc.stderr


@pytest.mark.e2e
@pytest.mark.cli(build=lambda tmp: Cli(["env", "--json"], master=None, timeout=120))
def test_env_reports_versions(cli):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    info = json.loads(proc.stdout)
    assert info["torch"].startswith("2.") and info["pyspark"].startswith("4.") and info["java_major"] >= 17


def _parquet_job(tmp: Path) -> Cli:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3)).astype(np.float32)
    y = (x.sum(1) > 0).astype(np.int64)
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y}), tmp / "d.parquet")
    script = tmp / "model.py"
    script.write_text("from torch import nn\nmodel = nn.Linear(3, 2)\n")
    return Cli(
        [
            "train",
            str(script),
            "--data",
            str(tmp / "d.parquet"),
            "--eval-data",
            str(tmp / "d.parquet"),
            "--features",
            "a,b,c",
            "--label",
            "y",
            "--workers",
            "2",
            "--epochs",
            "4",
            "--batch-size",
            "16",
            "--optimizer",
            "sgd",
            "--lr",
            "0.2",
            "--json-out",
            str(tmp / "s.json"),
        ]
    )


@pytest.mark.e2e
@pytest.mark.cli(build=_parquet_job)
def test_parquet_data_from_the_command_line(cli):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    assert json.loads((cli.tmp / "s.json").read_text())["test_accuracy"] > 0.9


@pytest.mark.e2e
@pytest.mark.slow  # (make test-all) diloco's state round trip is in tests/strategies/test_diloco.py
def test_diloco_with_int8_deltas_checkpoints_its_outer_momentum_and_resumes(tmp_path):
    from sparkdp.train.checkpoint import latest_checkpoint

    script = tmp_path / "train_me.py"
    script.write_text(SCRIPT)
    ckpt, summary = tmp_path / "ckpt", tmp_path / "s.json"
    job = [
        "train",
        str(script),
        "--workers",
        "2",
        "--strategy",
        "diloco",
        "--strategy-option",
        "period=2",
        "--strategy-option",
        "compression=int8",
        "--checkpoint-dir",
        str(ckpt),
        "--json-out",
        str(summary),
    ]
    proc = sparkdp(*job, "--epochs", "1")
    assert proc.returncode == 0, _explain(proc)
    first = json.loads(summary.read_text())
    assert first["strategy"] == "diloco" and first["strategy_options"]["compression"] == "int8", first
    # the summary names the outer momentum's tensors; the checkpoint holds them
    buffers = first["strategy_state"]["outer"]["state"]
    assert buffers and all(v["momentum_buffer"].startswith("tensor(float32") for v in buffers.values()), (
        buffers
    )
    saved = latest_checkpoint(ckpt)
    assert saved is not None and saved.epoch == 1
    momentum = [v["momentum_buffer"] for v in saved.strategy_state["outer"]["state"].values()]
    assert all(m.abs().sum() > 0 for m in momentum)
    proc = sparkdp(*job, "--epochs", "2", "--resume", str(ckpt))
    assert proc.returncode == 0, _explain(proc)
    resumed = json.loads(summary.read_text())
    assert len(resumed["history"]) == 2 and resumed["test_accuracy"] > 0.9, resumed
