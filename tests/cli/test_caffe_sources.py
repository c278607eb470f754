"""``sparkdp train --caffe-net NET --caffe-solver SOLVER`` with no --dataset/--data: the net's own LMDB.

LeNet's Data layers name ``examples/mnist/mnist_{train,test}_lmdb``; here they name LMDBs of
real Fashion-MNIST Datums written by the test, and the run is compared with the same job fed
the same rows through the built-in dataset path (``fit_caffe`` on ``load_dataset(limit=...)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import Cli
from tests.cli.test_caffe_train import FASHION, _example, _explain, needs_fashion, sparkdp

pytest.importorskip("lmdb")

ROWS = 3000


@pytest.mark.slow  # two LeNet trainings; tests/caffe/test_sources.py checks the LMDB reader itself
@pytest.mark.e2e
@pytest.mark.spark
@needs_fashion
def test_lenet_from_its_lmdb_matches_the_built_in_dataset_run(tmp_path, spark):
    from sparkdp.caffe.sources import write_datum_db
    from sparkdp.data import load_dataset

    assert FASHION.is_dir()
    ds = load_dataset("fashion-mnist", limit=ROWS)
    write_datum_db(tmp_path / "fashion_train_lmdb", ds.x_train_uint8, ds.y_train)  # uint8 1×28×28 Datums
    write_datum_db(tmp_path / "fashion_test_lmdb", ds.x_test_uint8, ds.y_test)
    text = _example("lenet_train_test.prototxt").read_text()
    text = text.replace("examples/mnist/mnist_train_lmdb", "fashion_train_lmdb")
    (tmp_path / "lenet.prototxt").write_text(
        text.replace("examples/mnist/mnist_test_lmdb", "fashion_test_lmdb")
    )
    solver = _example("lenet_solver.prototxt")
    common = ["--caffe-solver", str(solver), "--workers", "2", "--epochs", "3", "--seed", "0", "-q"]

    # relative sources: found from the working directory, as Caffe looks for them
    proc = sparkdp(
        "train",
        "--caffe-net",
        "lenet.prototxt",
        *common,
        "--json-out",
        "lmdb.json",
        "--out",
        "out",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, _explain(proc)
    own = json.loads((tmp_path / "lmdb.json").read_text())
    assert [h["samples"] for h in own["history"]] == [ROWS] * 3
    sidecar = json.loads((tmp_path / "out" / "model.json").read_text())
    assert sidecar["caffe_data"].startswith("LMDB") and "scale 0.00390625" in sidecar["caffe_data"], sidecar
    assert (
        "fashion_test_lmdb" in sidecar["caffe_eval_data"]
        and (tmp_path / "out" / "model.caffemodel").is_file()
    )

    # the built-in path in this process (the shared session: no second Spark start-up to wait for)
    from sparkdp.caffe.train import fit_caffe

    result = fit_caffe(
        tmp_path / "lenet.prototxt", solver, ds, workers=2, epochs=3, seed=0, spark=spark, show_progress=False
    )
    builtin = {"test_accuracy": result.test_accuracy, "history": result.history}

    # Same net, init, solver and rows; only the shuffling differs (blocks + buffer vs a permutation).
    # Seeds 0-2 measured 0.715/0.752, 0.741/0.739, 0.755/0.754 (LMDB/built-in) after 3 epochs.
    assert own["test_accuracy"] > 0.65 and builtin["test_accuracy"] > 0.65, (own, builtin)
    assert abs(own["test_accuracy"] - builtin["test_accuracy"]) <= 0.06, (own["history"], builtin["history"])


def _missing_lmdb(tmp: Path) -> Cli:
    (tmp / "lenet.prototxt").write_text(_example("lenet_train_test.prototxt").read_text())
    return Cli(
        [
            "train",
            "--caffe-net",
            str(tmp / "lenet.prototxt"),
            "--caffe-solver",
            str(_example("lenet_solver.prototxt")),
        ],
        master=None,
        timeout=120,
        cwd=tmp,
    )


@pytest.mark.e2e
@pytest.mark.cli(build=_missing_lmdb)
def test_missing_lmdb_source_is_a_readable_error(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert "examples/mnist/mnist_train_lmdb' does not exist" in proc.stderr, _explain(proc)
    assert "convert_imageset" in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)
