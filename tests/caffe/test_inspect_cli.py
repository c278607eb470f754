"""``inspect_net`` and the ``sparkdp caffe inspect`` command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sparkdp.caffe import inspect_net
from sparkdp.cli import caffe_cmd
from sparkdp.errors import ConfigError

EXAMPLES = Path(__file__).parent / "data"


def test_inspect_lenet(examples):
    report = inspect_net(examples / "lenet.prototxt")
    assert report["learnable_params"] == 431_080 and report["frozen_params"] == 0
    assert report["outputs"] == {"prob": [64, 10]}
    assert report["inputs"] == {"data": [64, 1, 28, 28]}
    rows = {row["name"]: row for row in report["layers"]}
    assert rows["pool2"]["top_shapes"] == [[64, 50, 4, 4]] and rows["ip1"]["params"] == 400_500


def test_inspect_train_test_label_follows_batch(examples):
    report = inspect_net(
        examples / "cifar10_quick_train_test.prototxt", phase="TEST", input_shape=(8, 3, 32, 32)
    )
    assert report["inputs"] == {"data": [8, 3, 32, 32], "label": [8]}
    assert report["outputs"] == {"accuracy": [], "loss": []}
    assert report["learnable_params"] == 145_578
    with pytest.raises(ConfigError, match="--input-shape"):
        inspect_net(examples / "cifar10_quick_train_test.prototxt", phase="TRAIN")


def _run(argv):
    parser = argparse.ArgumentParser(prog="sparkdp")
    caffe_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_json_and_table(examples, capsys):
    assert (
        _run(
            [
                "caffe",
                "inspect",
                str(examples / "lenet_train_test.prototxt"),
                "--phase",
                "train",
                "--input-shape",
                "4,1,28,28",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["outputs"] == {"loss": []} and report["phase"] == "TRAIN"
    assert _run(["caffe", "inspect", str(examples / "lenet.prototxt")]) == 0
    text = capsys.readouterr().out
    assert "conv1" in text and "431,080" in text


def test_cli_errors(examples, capsys):
    assert _run(["caffe", "inspect", str(examples / "lenet_train_test.prototxt")]) == 2
    assert "pass input_shapes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _run(["caffe", "inspect", "x.prototxt", "--input-shape", "a,b"])


# --------------------------------------------------------------- shapes for every input

# The structure of BVLC Caffe's hdf5_classification example (written here): logistic regression
# on HDF5Data whose records' shapes (data (N, 4), label (N,)) only the HDF5 files know, so every
# top needs --input-shape.
HDF5_CLASSIFICATION = """name: "LogisticRegressionNet"
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }
        hdf5_data_param { source: "examples/hdf5_classification/data/train.txt" batch_size: 10 } }
layer { name: "data" type: "HDF5Data" top: "data" top: "label" include { phase: TEST }
        hdf5_data_param { source: "examples/hdf5_classification/data/test.txt" batch_size: 10 } }
layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 2 weight_filler { type: "xavier" }
                              bias_filler { type: "constant" value: 0 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc1" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "fc1" bottom: "label" top: "accuracy"
        include { phase: TEST } }
"""

# Two inputs without declared shapes feeding one InnerProduct (shared by param name), as in
# BVLC's siamese example: both shapes must come from the command line.
TWO_INPUTS = """name: "pair"
layer { name: "left" type: "Input" top: "data" }
layer { name: "right" type: "Input" top: "data_p" }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "feat"
  param { name: "ip_w" } param { name: "ip_b" } inner_product_param { num_output: 3 } }
layer { name: "ip_p" type: "InnerProduct" bottom: "data_p" top: "feat_p"
  param { name: "ip_w" } param { name: "ip_b" } inner_product_param { num_output: 3 } }
"""


@pytest.fixture
def hdf5_net(tmp_path):
    path = tmp_path / "train_val.prototxt"
    path.write_text(HDF5_CLASSIFICATION)
    return path


def _json(argv, capsys):
    assert _run([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_hdf5_classification_from_the_cli(hdf5_net, phase, capsys):
    assert _run(["caffe", "inspect", str(hdf5_net), "--phase", phase]) == 2
    err = capsys.readouterr().err
    assert "'data' has a shape only the HDF5 file knows" in err
    assert "--input-shape data=N,... --input-shape label=N,..." in err
    report = _json(
        [
            "caffe",
            "inspect",
            str(hdf5_net),
            "--phase",
            phase,
            "--input-shape",
            "data=10,4",
            "--input-shape",
            "label=10",
        ],
        capsys,
    )
    assert report["name"] == "LogisticRegressionNet" and report["phase"] == phase
    assert report["inputs"] == {"data": [10, 4], "label": [10]}
    expected = {"loss": []} if phase == "TRAIN" else {"loss": [], "accuracy": []}
    assert report["outputs"] == expected
    assert report["learnable_params"] == 4 * 2 + 2
    rows = {row["name"]: row for row in report["layers"]}
    assert rows["fc1"]["top_shapes"] == [[10, 2]] and rows["data"]["top_shapes"] == [[10, 4], [10]]
    # the bare form still names the first input, and mixes with named ones
    mixed = _json(
        ["caffe", "inspect", str(hdf5_net), "--input-shape", "10,4", "--input-shape", "label=10"], capsys
    )
    assert mixed["inputs"] == report["inputs"]


def test_hdf5_classification_python_api(hdf5_net):
    report = inspect_net(hdf5_net, phase="TRAIN", input_shapes={"data": (3, 4), "label": (3,)})
    assert report["inputs"] == {"data": [3, 4], "label": [3]} and report["outputs"] == {"loss": []}
    both = inspect_net(hdf5_net, input_shape=(5, 4), input_shapes={"label": [5]})
    assert both["inputs"] == {"data": [5, 4], "label": [5]}
    with pytest.raises(ConfigError, match="given twice"):
        inspect_net(hdf5_net, input_shape=(5, 4), input_shapes={"data": (5, 4), "label": (5,)})
    with pytest.raises(ConfigError, match=r"'fc1', which is not an input of the TEST net.*data, label"):
        inspect_net(hdf5_net, input_shapes={"data": (5, 4), "label": (5,), "fc1": (5, 2)})


def test_two_inputs_both_shapes(tmp_path, capsys):
    path = tmp_path / "pair.prototxt"
    path.write_text(TWO_INPUTS)
    report = _json(
        ["caffe", "inspect", str(path), "--input-shape", "data=5,8", "--input-shape", "data_p=7x8"], capsys
    )
    assert report["inputs"] == {"data": [5, 8], "data_p": [7, 8]}
    assert report["outputs"] == {"feat": [5, 3], "feat_p": [7, 3]}
    assert report["learnable_params"] == 8 * 3 + 3  # one shared weight and bias
    # the first input by position, the second by name
    again = _json(
        ["caffe", "inspect", str(path), "--input-shape", "5,8", "--input-shape", "data_p=7,8"], capsys
    )
    assert again["inputs"] == report["inputs"]
    assert _run(["caffe", "inspect", str(path), "--input-shape", "data=5,8"]) == 2
    assert "'data_p' has no shape" in capsys.readouterr().err


_SHAPES = {  # full shapes of the Data layers' tops in the BVLC example nets
    "lenet_train_test.prototxt": ["data=4,1,28,28"],
    "cifar10_quick_train_test.prototxt": ["data=4,3,32,32", "label=4"],
}
_NETS = sorted(p.name for p in EXAMPLES.glob("*.prototxt") if not p.name.endswith("_solver.prototxt"))


def test_the_example_nets_are_found():
    assert {"lenet.prototxt", "lenet_train_test.prototxt", "cifar10_quick.prototxt"} <= set(_NETS)


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("name", _NETS)
def test_every_example_net_inspects(name, phase, capsys):
    argv = ["caffe", "inspect", str(EXAMPLES / name), "--phase", phase]
    for shape in _SHAPES.get(name, []):
        argv += ["--input-shape", shape]
    report = _json(argv, capsys)
    assert report["outputs"] and report["learnable_params"] > 0
    assert _run(argv) == 0 and "learnable parameters" in capsys.readouterr().out  # the table too


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("x=", "shape after '='"),
        ("=1,2", "name before '='"),
        ("a=1,b", "in 'a=1,b': expected comma-separated integers"),
        ("data=0,4", "positive dims"),
        ("1,b", "comma-separated integers"),
    ],
)
def test_bad_input_shape_forms(hdf5_net, value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _run(["caffe", "inspect", str(hdf5_net), "--input-shape", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --input-shape:" in err and message in err


@pytest.mark.parametrize(
    "values",
    [["10,4", "10,4"], ["label=10", "label=12"]],
)
def test_an_input_given_twice(hdf5_net, values, capsys):
    argv = ["caffe", "inspect", str(hdf5_net)]
    for value in values:
        argv += ["--input-shape", value]
    with pytest.raises(SystemExit) as exit_info:
        _run(argv)
    assert exit_info.value.code == 2
    assert "more than once" in capsys.readouterr().err


def test_unknown_input_name(hdf5_net, capsys):
    argv = ["caffe", "inspect", str(hdf5_net), "--input-shape", "data=10,4", "--input-shape", "lable=10"]
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("sparkdp caffe inspect: error: input shape given for 'lable'")
    assert "its inputs (tops of its data layers) are: data, label" in err
    # a blob that exists but is computed, not fed, is not an input either
    assert _run(["caffe", "inspect", str(hdf5_net), "--input-shape", "fc1=10,2"]) == 2
    assert "'fc1', which is not an input" in capsys.readouterr().err
