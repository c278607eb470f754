"""``sparkdp train --caffe-net/--caffe-solver``: a Caffe net trained with its own solver, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.e2e
@needs_fashion
def test_lenet_trains_with_its_solver_and_writes_a_caffemodel(tmp_path):
    import torch

    from sparkdp.caffe.net import load_net
    from sparkdp.caffe.weights import load_weights

    net, solver = _example("lenet_train_test.prototxt"), _example("lenet_solver.prototxt")
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    # The solver's `net: "examples/mnist/..."` does not exist here: --caffe-net takes precedence.
    proc = sparkdp(
        "-v",
        "train",
        "--caffe-net",
        str(net),
        "--caffe-solver",
        str(solver),
        "--dataset",
        "fashion-mnist",
        "--limit",
        "3000",
        "--workers",
        "2",
        "--epochs",
        "1",
        "--json-out",
        str(summary),
        "--out",
        str(out),
        cwd=tmp_path,
    )
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


@pytest.mark.e2e
@needs_fashion
def test_missing_prototxt_is_a_readable_error(tmp_path):
    solver = _example("lenet_solver.prototxt")
    proc = sparkdp(
        "train",
        "--caffe-net",
        str(tmp_path / "nope.prototxt"),
        "--caffe-solver",
        str(solver),
        "--dataset",
        "fashion-mnist",
        "--limit",
        "100",
        timeout=120,
    )
    assert proc.returncode == 2, _explain(proc)
    assert "nope.prototxt" in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)

    proc = sparkdp(
        "train",
        "--caffe-net",
        str(_example("lenet_train_test.prototxt")),
        "--caffe-solver",
        str(tmp_path / "missing_solver.prototxt"),
        "--dataset",
        "fashion-mnist",
        "--limit",
        "100",
        timeout=120,
    )
    assert proc.returncode == 2, _explain(proc)
    assert "missing_solver.prototxt" in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)


@pytest.mark.e2e
@needs_fashion
def test_caffe_flags_refuse_clashing_options(tmp_path):
    net, solver = _example("lenet_train_test.prototxt"), _example("lenet_solver.prototxt")
    proc = sparkdp(
        "train",
        "--caffe-net",
        str(net),
        "--caffe-solver",
        str(solver),
        "--model",
        "cnn",
        "--lr",
        "0.1",
        "--dataset",
        "fashion-mnist",
        "--limit",
        "100",
        timeout=120,
    )
    assert proc.returncode == 2, _explain(proc)
    assert "--model, --lr cannot be used" in proc.stderr, _explain(proc)
    proc = sparkdp(
        "train", "--caffe-net", str(net), "--dataset", "fashion-mnist", "--limit", "100", timeout=120
    )
    assert proc.returncode == 2 and "need --caffe-solver" in proc.stderr, _explain(proc)
