"""``sparkdp caffe convert``: .caffemodel → safetensors state dict and back, checked against
independent references (``save_weights`` of a seeded net, ``load_state_dict``, ``read_caffemodel``)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import sparkdp
from sparkdp.caffe import convert_to_caffemodel, convert_to_safetensors, load_net, save_weights
from sparkdp.caffe.caffemodel import read_caffemodel
from sparkdp.caffe.weights import WeightsMismatchError
from sparkdp.cli import caffe_cmd
from sparkdp.errors import ConfigError

EXAMPLES = Path(__file__).parent / "data"
LENET = EXAMPLES / "lenet.prototxt"

# Conv + BatchNorm (statistics buffers, not parameters) + Scale + a shared InnerProduct.
BN_SHARED = """name: "bn_shared"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "ip_a" type: "InnerProduct" bottom: "conv" top: "a" param { name: "w" } param { name: "b" }
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "ip_b" type: "InnerProduct" bottom: "conv" top: "b" param { name: "w" } param { name: "b" }
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
"""


def _run(argv):
    parser = argparse.ArgumentParser(prog="sparkdp")
    caffe_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def _seeded(prototxt, seed: int, **kwargs):
    torch.manual_seed(seed)
    net = load_net(prototxt, phase=kwargs.pop("phase", "TEST"), **kwargs)
    with torch.no_grad():  # every tensor random, biases and BatchNorm statistics included
        for tensor in net.state_dict().values():
            tensor.copy_(torch.rand(tensor.shape) + 0.5)
    return net.eval()


def _blobs(layers):
    return {layer.name: [np.asarray(b) for b in layer.blobs] for layer in layers}


def _same_blobs(a, b) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k])
        and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a[k], b[k]))
        for k in a
    )


def _leftovers(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


@pytest.fixture
def lenet(tmp_path):
    """lenet.prototxt copied into tmp_path, and a .caffemodel of a seeded net (save_weights)."""
    prototxt = tmp_path / "lenet.prototxt"
    shutil.copy(LENET, prototxt)
    trained = _seeded(prototxt, 1)
    caffemodel = save_weights(trained, tmp_path / "lenet.caffemodel", name="LeNet")
    return prototxt, caffemodel, trained


def test_lenet_caffemodel_to_safetensors(lenet, tmp_path, capsys, monkeypatch):
    prototxt, caffemodel, trained = lenet
    out = tmp_path / "lenet.safetensors"
    assert _run(["caffe", "convert", str(prototxt), "--weights", str(caffemodel), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 8 tensors, 431,080 values of net 'LeNet' (TEST)" in printed
    assert f"weights from {caffemodel} (4 layers)" in printed and "load_net('lenet.prototxt'" in printed

    fresh = load_net(LENET, phase="TEST")  # filler values, different from the trained ones
    x = torch.rand(64, 1, 28, 28)
    assert not torch.equal(fresh(data=x), trained(data=x))
    fresh.load_state_dict(load_file(out), strict=True)
    assert torch.equal(fresh(data=x), trained(data=x))
    # the file's tensors are exactly the .caffemodel's blobs (independent reader)
    stored = load_file(out)
    layers = {layer.name: layer.blobs for layer in read_caffemodel(caffemodel) if layer.blobs}
    assert sorted(layers) == ["conv1", "conv2", "ip1", "ip2"] and len(stored) == 2 * len(layers)
    for name, (weight, bias) in layers.items():  # Caffe's blob order: weight, bias
        assert np.array_equal(weight, stored[f"layers.{name}.weight"].numpy())
        assert np.array_equal(bias, stored[f"layers.{name}.bias"].numpy())

    with safe_open(str(out), framework="pt") as handle:
        meta = handle.metadata()
    assert meta["sparkdp.net_name"] == "LeNet" and meta["sparkdp.phase"] == "TEST"
    assert meta["sparkdp.version"] == sparkdp.__version__ and meta["sparkdp.prototxt"] == "lenet.prototxt"
    assert meta["sparkdp.weights"] == "lenet.caffemodel"
    # the recorded loading line works as written, next to the prototxt
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(meta["sparkdp.load"], scope)
    assert torch.equal(scope["net"].eval()(data=x), trained(data=x))


def test_safetensors_to_caffemodel_round_trips_blobs_exactly(lenet, tmp_path, capsys):
    prototxt, caffemodel, trained = lenet
    # a state dict written by plain safetensors (not by convert), as after fine-tuning in PyTorch
    tuned = _seeded(prototxt, 2)
    save_file(tuned.state_dict(), tmp_path / "tuned.safetensors")
    out = tmp_path / "tuned.caffemodel"
    argv = [
        "caffe",
        "convert",
        str(prototxt),
        "--weights",
        str(tmp_path / "tuned.safetensors"),
        "--to-caffemodel",
        str(out),
    ]
    assert _run(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 4 layers with 8 blobs, 431,080 values of net 'LeNet' (TEST), from " in printed
    written = _blobs(read_caffemodel(out))
    expected = {name: [b.detach().numpy() for b in tuned.blobs_of(name)] for name, _ in tuned.caffe_layers}
    assert _same_blobs(written, expected)

    # .caffemodel → safetensors → .caffemodel: the same blobs as the original file
    convert_to_safetensors(prototxt, tmp_path / "round.safetensors", weights=caffemodel)
    result = convert_to_caffemodel(prototxt, tmp_path / "round.safetensors", tmp_path / "round.caffemodel")
    assert result.loaded == ("conv1", "conv2", "ip1", "ip2") and result.tensors == 8
    assert _same_blobs(
        _blobs(read_caffemodel(tmp_path / "round.caffemodel")), _blobs(read_caffemodel(caffemodel))
    )


def test_batchnorm_buffers_and_shared_params(tmp_path):
    net = _seeded(BN_SHARED, 3)
    caffemodel = save_weights(net, tmp_path / "bn.caffemodel")
    result = convert_to_safetensors(BN_SHARED, tmp_path / "bn.safetensors", weights=caffemodel)
    stored = load_file(result.path)
    assert {"layers.bn.mean_acc", "layers.bn.var_acc", "layers.bn.scale_factor"} <= set(stored)
    assert torch.equal(stored["layers.ip_a.weight"], stored["layers.ip_b.weight"])  # both aliases stored
    assert result.metadata["sparkdp.prototxt"] == "NET.prototxt"  # given as text: no file name
    fresh = load_net(BN_SHARED, phase="TEST").eval()
    fresh.load_state_dict(stored, strict=True)
    x = torch.rand(2, 3, 6, 6)
    expected = net(data=x)
    assert all(torch.equal(t, expected[k]) for k, t in fresh(data=x).items())

    back = convert_to_caffemodel(BN_SHARED, result.path, tmp_path / "bn_again.caffemodel")
    assert back.loaded == ("conv", "bn", "scale", "ip_a", "ip_b")
    assert _same_blobs(_blobs(read_caffemodel(back.path)), _blobs(read_caffemodel(caffemodel)))

    # safetensors' own save_model keeps one name per shared tensor: accepted too
    safetensors.torch.save_model(net, str(tmp_path / "dedup.safetensors"))
    assert len(load_file(tmp_path / "dedup.safetensors")) < len(stored)
    again = convert_to_caffemodel(BN_SHARED, tmp_path / "dedup.safetensors", tmp_path / "dedup.caffemodel")
    assert _same_blobs(_blobs(read_caffemodel(again.path)), _blobs(read_caffemodel(caffemodel)))

    # aliases that disagree are an error
    stored["layers.ip_b.bias"] = stored["layers.ip_b.bias"] + 1
    save_file(stored, tmp_path / "split.safetensors")
    with pytest.raises(
        WeightsMismatchError, match=r"'layers.ip_b.bias' shares its parameter with 'layers.ip_a.bias'"
    ):
        convert_to_caffemodel(BN_SHARED, tmp_path / "split.safetensors", tmp_path / "split.caffemodel")


def test_strict_loading_names_every_mismatch(lenet, tmp_path, capsys):
    prototxt, caffemodel, _ = lenet
    out = tmp_path / "good.caffemodel"
    shutil.copy(caffemodel, out)
    before = out.read_bytes()
    state = load_net(prototxt, phase="TEST").state_dict()
    del state["layers.ip1.bias"]
    state["layers.ip2.weight"] = torch.zeros(5, 500)
    state["layers.extra.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(WeightsMismatchError) as info:
        convert_to_caffemodel(prototxt, tmp_path / "bad.safetensors", out)
    message = str(info.value)
    assert "3 mismatch(es); nothing was loaded" in message
    assert "missing key 'layers.ip1.bias' (shape [500])" in message
    assert "unexpected key 'layers.extra.weight'" in message
    assert "key 'layers.ip2.weight': the net expects shape [10, 500], the file has [5, 500]" in message
    argv = [
        "caffe",
        "convert",
        str(prototxt),
        "--weights",
        str(tmp_path / "bad.safetensors"),
        "--to-caffemodel",
        str(out),
    ]
    assert _run(argv) == 2
    assert "sparkdp caffe convert: error: cannot load" in capsys.readouterr().err
    assert out.read_bytes() == before  # the previous file is untouched
    # a wrapper module's state dict ("module.conv1.weight"...): the error says what to strip
    wrapped = {f"module.{k}": v for k, v in load_net(prototxt, phase="TEST").state_dict().items()}
    save_file(wrapped, tmp_path / "wrapped.safetensors")
    with pytest.raises(WeightsMismatchError, match="behind the prefix 'module.'"):
        convert_to_caffemodel(prototxt, tmp_path / "wrapped.safetensors", out)
    assert out.read_bytes() == before
    keep = {"lenet.prototxt", "lenet.caffemodel", "good.caffemodel", "bad.safetensors", "wrapped.safetensors"}
    assert _leftovers(tmp_path, keep) == []


def test_a_failed_conversion_leaves_the_old_output(lenet, tmp_path, capsys, monkeypatch):
    prototxt, caffemodel, _ = lenet
    out = tmp_path / "model.safetensors"
    convert_to_safetensors(prototxt, out, weights=caffemodel)
    before = out.read_bytes()
    keep = {"lenet.prototxt", "lenet.caffemodel", "model.safetensors", "other.prototxt", "other.caffemodel"}

    # weights of another net (ip2 has 5 outputs): refused before anything is written
    other = tmp_path / "other.prototxt"
    other.write_text(LENET.read_text().replace("num_output: 10", "num_output: 5"))
    save_weights(load_net(other, phase="TEST"), tmp_path / "other.caffemodel")
    argv = [
        "caffe",
        "convert",
        str(prototxt),
        "--weights",
        str(tmp_path / "other.caffemodel"),
        "--out",
        str(out),
    ]
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert "layer 'ip2' (InnerProduct) blob 0: the net expects shape [10, 500], the file has [5, 500]" in err
    assert out.read_bytes() == before and _leftovers(tmp_path, keep) == []

    # a failure while writing (disk full, killed...): the half-written file never replaces the old one
    def half_written(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x00" * 10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(OSError, match="No space left"):
        convert_to_safetensors(prototxt, out, weights=caffemodel)
    assert out.read_bytes() == before and _leftovers(tmp_path, keep) == []
    argv = ["caffe", "convert", str(prototxt), "--weights", str(caffemodel), "--out", str(out)]
    assert _run(argv) == 2
    assert f"error: cannot write {out}: [Errno 28] No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == before and _leftovers(tmp_path, keep) == []


def test_input_shapes_for_data_layers_are_recorded(tmp_path, capsys, monkeypatch):
    prototxt = tmp_path / "lenet_train_test.prototxt"
    shutil.copy(EXAMPLES / "lenet_train_test.prototxt", prototxt)
    out = tmp_path / "tt.safetensors"
    argv = ["caffe", "convert", str(prototxt), "--phase", "train", "--out", str(out)]
    assert _run(argv) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert _run([*argv, "--input-shape", "data=4,1,28,28"]) == 0
    printed = capsys.readouterr().out
    assert "weights from the prototxt's fillers (no --weights given)" in printed
    meta = convert_to_safetensors(prototxt, out, phase="TRAIN", input_shape=(4, 1, 28, 28)).metadata
    assert meta["sparkdp.input_shapes"] == '{"data": [4, 1, 28, 28]}' and meta["sparkdp.phase"] == "TRAIN"
    assert "input_shapes={'data': (4, 1, 28, 28)}" in meta["sparkdp.load"]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(meta["sparkdp.load"], scope)
    assert scope["net"].phase == "TRAIN"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--out", "a.safetensors", "--to-caffemodel", "b.caffemodel"],
            "argument --to-caffemodel: not allowed with argument --out",
        ),
        ([], "one of the arguments --out --to-caffemodel is required"),
        (["--to-caffemodel", "b.caffemodel"], "--to-caffemodel needs --weights MODEL.safetensors"),
    ],
)
def test_out_xor_to_caffemodel(extra, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _run(["caffe", "convert", str(LENET), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: sparkdp caffe convert") and message in err


def test_readable_errors(lenet, tmp_path, capsys):
    prototxt, caffemodel, _ = lenet
    with pytest.raises(ConfigError, match="is a safetensors file.*use --to-caffemodel"):
        convert_to_safetensors(prototxt, tmp_path / "x.safetensors", weights=tmp_path / "y.safetensors")
    with pytest.raises(ConfigError, match=r"is a \.caffemodel.*use --out"):
        convert_to_caffemodel(prototxt, caffemodel, tmp_path / "x.caffemodel")
    with pytest.raises(ConfigError, match="no such file"):
        convert_to_caffemodel(prototxt, tmp_path / "missing.safetensors", tmp_path / "x.caffemodel")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="cannot read safetensors file"):
        convert_to_caffemodel(prototxt, tmp_path / "junk.safetensors", tmp_path / "x.caffemodel")
    with pytest.raises(ConfigError, match="directory .* does not exist"):
        convert_to_safetensors(prototxt, tmp_path / "nowhere" / "x.safetensors", weights=caffemodel)
    argv = [
        "caffe",
        "convert",
        str(prototxt),
        "--input-shape",
        "label=3",
        "--out",
        str(tmp_path / "x.safetensors"),
    ]
    assert _run(argv) == 2
    assert (
        "'label', which is not an input of the TEST net; its inputs (tops of its data layers) are: data"
        in (capsys.readouterr().err)
    )
    assert not (tmp_path / "x.safetensors").exists()
