"""``sparkdp train --caffe-net/--caffe-solver``: a Caffe net trained with its own solver, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Cli

SPARKDP = [sys.executable, "-m", "sparkdp.cli.main"]
FASHION = Path("/usr/share/datasets/fashion-mnist")
CAFFE_DATA = Path(__file__).parents[1] / "caffe" / "data"  # BVLC/caffe example files, copied unchanged
needs_fashion = pytest.mark.skipif(not FASHION.is_dir(), reason="dataset-fashion-mnist is not installed")


def _example(name: str) -> Path:
    for root in (CAFFE_DATA, Path("/work/shared/caffe")):
        if (root / name).is_file():
            return root / name
    pytest.skip(f"{name} is not available")


def sparkdp(*args: str, timeout: float = 240, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SPARKDP, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ), cwd=cwd
    )


def _explain(proc) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _lenet_job(tmp: Path) -> Cli:
    # The solver's `net: "examples/mnist/..."` does not exist here: --caffe-net takes precedence.
    return Cli(
        [
            "-v",
            "train",
            "--caffe-net",
            str(_example("lenet_train_test.prototxt")),
            "--caffe-solver",
            str(_example("lenet_solver.prototxt")),
            "--dataset",
            "fashion-mnist",
            "--limit",
            "3000",
            "--workers",
            "2",
            "--epochs",
            "1",
            "--json-out",
            str(tmp / "summary.json"),
            "--out",
            str(tmp / "out"),
        ],
        cwd=tmp,
    )


@pytest.mark.e2e
@needs_fashion
@pytest.mark.cli(build=_lenet_job)
def test_lenet_trains_with_its_solver_and_writes_a_caffemodel(cli):
    import torch

    from sparkdp.caffe.net import load_net
    from sparkdp.caffe.weights import load_weights

    net = _example("lenet_train_test.prototxt")
    out, summary = cli.tmp / "out", cli.tmp / "summary.json"
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    data = json.loads(summary.read_text())
    assert data["workers"] == 2 and data["epochs"] == 1
    assert data["test_accuracy"] > 0.5, data
    assert "solver_mode GPU is ignored" in proc.stderr
    # 3000 rows / (2 workers x the Data layer's batch_size 64) -> 24 steps of the inv policy
    assert data["history"][0]["samples"] == 3000

    fresh = load_net(net, phase="TEST", input_shapes={"data": (2, 1, 28, 28)})
    before = fresh.blobs_of("ip2")[0].clone()
    summary_load = load_weights(fresh, out / "model.caffemodel")
    assert summary_load.loaded == ("conv1", "conv2", "ip1", "ip2")
    assert not torch.equal(before, fresh.blobs_of("ip2")[0])
    sidecar = json.loads((out / "model.json").read_text())
    assert sidecar["caffe_net"] == str(net.resolve()) and sidecar["dataset"] == "fashion-mnist"


def _refused(*argv: str) -> Cli:
    """A command line refused before Spark starts."""
    return Cli(["train", *argv, "--dataset", "fashion-mnist", "--limit", "100"], master=None, timeout=120)


@pytest.mark.e2e
@needs_fashion
@pytest.mark.cli(
    build=lambda tmp: [
        _refused(
            "--caffe-net",
            str(tmp / "nope.prototxt"),
            "--caffe-solver",
            str(_example("lenet_solver.prototxt")),
        ),
        _refused(
            "--caffe-net",
            str(_example("lenet_train_test.prototxt")),
            "--caffe-solver",
            str(tmp / "missing_solver.prototxt"),
        ),
    ]
)
def test_missing_prototxt_is_a_readable_error(cli):
    proc, no_solver = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert "nope.prototxt" in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)

    proc = no_solver
    assert proc.returncode == 2, _explain(proc)
    assert "missing_solver.prototxt" in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)


@pytest.mark.e2e
@needs_fashion
@pytest.mark.cli(
    build=lambda tmp: [
        _refused(
            "--caffe-net",
            str(_example("lenet_train_test.prototxt")),
            "--caffe-solver",
            str(_example("lenet_solver.prototxt")),
            "--model",
            "cnn",
            "--lr",
            "0.1",
        ),
        _refused("--caffe-net", str(_example("lenet_train_test.prototxt"))),
    ]
)
def test_caffe_flags_refuse_clashing_options(cli):
    proc, no_solver = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert "--model, --lr cannot be used" in proc.stderr, _explain(proc)
    proc = no_solver
    assert proc.returncode == 2 and "need --caffe-solver" in proc.stderr, _explain(proc)
