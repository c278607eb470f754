"""``inspect_net`` and the ``sparkdp caffe inspect`` command."""

from __future__ import annotations

import argparse
import json

import pytest

from sparkdp.caffe import inspect_net
from sparkdp.cli import caffe_cmd
from sparkdp.errors import ConfigError


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
