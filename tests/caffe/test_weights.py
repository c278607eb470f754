"""Loading .caffemodel blobs into nets (by name, legacy shapes, all-or-nothing) and saving them."""

from __future__ import annotations

import importlib.util
import os
import struct

import numpy as np
import pytest
import torch

from sparkdp.caffe import caffemodel
from sparkdp.caffe.caffemodel import CaffeLayerBlobs, decode_net, encode_net
from sparkdp.caffe.weights import WeightsMismatchError, load_weights, save_weights
from sparkdp.errors import ConfigError


class FakeNet(torch.nn.Module):
    """The two methods weights.py relies on, over plain torch modules."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.ip = torch.nn.Linear(4, 3)
        for p in self.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g))
        # BatchNorm as Caffe keeps it: mean/var accumulators and the scale factor.
        self.register_buffer("bn_mean", torch.randn(2, generator=g))
        self.register_buffer("bn_var", torch.rand(2, generator=g))
        self.register_buffer("bn_factor", torch.tensor([7.0]))
        self.caffe_layers = [
            ("data", "Input"),
            ("conv1", "Convolution"),
            ("bn1", "BatchNorm"),
            ("relu1", "ReLU"),
            ("ip1", "InnerProduct"),
        ]

    def blobs_of(self, name):
        return {
            "conv1": [self.conv.weight, self.conv.bias],
            "bn1": [self.bn_mean, self.bn_var, self.bn_factor],
            "ip1": [self.ip.weight, self.ip.bias],
        }.get(name, [])


def state(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_save_then_load_round_trip(tmp_path):
    src, dst = FakeNet(0), FakeNet(1)
    path = save_weights(src, tmp_path / "w.caffemodel", name="fake")
    summary = load_weights(dst, path)
    assert summary.loaded == ("conv1", "bn1", "ip1")
    assert summary.ignored == () and summary.missing == () and summary.version == "V2"
    assert_same(state(src), state(dst))
    decoded = decode_net(path.read_bytes())
    assert decoded.name == "fake"
    assert [x.name for x in decoded.layers] == [
        "data",
        "conv1",
        "bn1",
        "relu1",
        "ip1",
    ]  # blob-less layers too
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_v1_legacy_file_loads_into_the_right_shapes():
    def lf(n, payload):
        payload = payload.encode() if isinstance(payload, str) else payload
        return bytes([n << 3 | 2]) + bytes([len(payload)]) + payload if len(payload) < 128 else None

    def vf(n, v):
        return bytes([n << 3, v])

    def blob(n, c, h, w, values):
        return vf(1, n) + vf(2, c) + vf(3, h) + vf(4, w) + lf(5, struct.pack(f"<{len(values)}f", *values))

    conv_w, conv_b = np.arange(18, dtype=np.float32), np.array([1, 2], np.float32)
    ip_w, ip_b = np.arange(12, dtype=np.float32) / 10, np.array([-1, 0, 1], np.float32)
    layers = [
        lf(4, "conv1") + vf(5, 4) + lf(6, blob(2, 1, 3, 3, conv_w)) + lf(6, blob(1, 1, 1, 2, conv_b)),
        lf(4, "relu1") + vf(5, 18),
        lf(4, "ip1") + vf(5, 14) + lf(6, blob(1, 1, 3, 4, ip_w)) + lf(6, blob(1, 1, 1, 3, ip_b)),
        lf(4, "old_fc") + vf(5, 14) + lf(6, blob(1, 1, 1, 1, [5.0])),
    ]
    data = b"".join(lf(2, x) for x in layers)
    net = FakeNet()
    summary = load_weights(net, decode_net(data), strict=False)
    assert (
        summary.loaded == ("conv1", "ip1") and summary.ignored == ("old_fc",) and summary.missing == ("bn1",)
    )
    assert summary.version == "V1"
    torch.testing.assert_close(net.conv.weight, torch.from_numpy(conv_w).reshape(2, 1, 3, 3))
    torch.testing.assert_close(net.conv.bias, torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(net.ip.weight, torch.from_numpy(ip_w).reshape(3, 4))
    torch.testing.assert_close(net.ip.bias, torch.tensor([-1.0, 0.0, 1.0]))


def test_mismatches_are_all_listed_and_nothing_is_loaded(tmp_path):
    net = FakeNet(0)
    before = state(net)
    layers = [
        CaffeLayerBlobs(
            "conv1", "Convolution", [np.zeros((2, 1, 3, 3), np.float32), np.zeros(2, np.float32)]
        ),
        CaffeLayerBlobs(
            "bn1", "BatchNorm", [np.zeros(2, np.float32), np.zeros(2, np.float32)]
        ),  # 2 of 3 blobs
        CaffeLayerBlobs("ip1", "InnerProduct", [np.zeros((3, 5), np.float32), np.zeros(4, np.float32)]),
    ]
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(encode_net(layers))
    with pytest.raises(WeightsMismatchError) as info:
        load_weights(net, path)
    text = str(info.value)
    assert "3 mismatch(es); nothing was loaded" in text
    assert "layer 'bn1' (BatchNorm): the net has 3 blob(s), the file has 2" in text
    assert "layer 'ip1' (InnerProduct) blob 0: the net expects shape [3, 4], the file has [3, 5]" in text
    assert "layer 'ip1' (InnerProduct) blob 1: the net expects shape [3], the file has [4]" in text
    assert_same(before, state(net))  # conv1 matched but was not loaded either


def test_legacy_shape_must_still_match_right_aligned():
    net = FakeNet()
    bad = CaffeLayerBlobs(
        "ip1",
        "InnerProduct",
        [np.zeros((1, 2, 3, 4), np.float32), np.zeros((1, 1, 1, 3), np.float32)],
        [True, True],
    )
    with pytest.raises(
        WeightsMismatchError, match=r"expects shape \[3, 4\], the file has \[1, 2, 3, 4\] \(legacy 4-D"
    ):
        load_weights(net, [bad], strict=False)


def test_strict_reports_missing_layers():
    net = FakeNet()
    only_ip = [CaffeLayerBlobs("ip1", "InnerProduct", [np.ones((3, 4), np.float32), np.ones(3, np.float32)])]
    with pytest.raises(WeightsMismatchError, match="layer 'conv1': the net has 2 blob.*no such layer"):
        load_weights(net, only_ip)
    summary = load_weights(net, only_ip, strict=False)
    assert summary.loaded == ("ip1",) and summary.missing == ("conv1", "bn1")
    assert torch.all(net.ip.weight == 1)


def test_failed_save_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "w.caffemodel"
    save_weights(FakeNet(0), path)
    good = path.read_bytes()

    def broken(handle, layers, name=""):
        handle.write(b"\x0a\x05par")
        raise OSError("disk full")

    monkeypatch.setattr("sparkdp.caffe.weights.write_caffemodel", broken)
    with pytest.raises(OSError, match="disk full"):
        save_weights(FakeNet(1), path)
    assert path.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["w.caffemodel"]  # no temp file left behind


def test_save_into_missing_directory_and_bad_sources(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        save_weights(FakeNet(), tmp_path / "nope" / "w.caffemodel")
    with pytest.raises(ConfigError, match="cannot read .caffemodel"):
        load_weights(FakeNet(), tmp_path / "missing.caffemodel")
    with pytest.raises(ConfigError, match="cannot load weights from a int"):
        load_weights(FakeNet(), 3)
    (tmp_path / "trunc.caffemodel").write_bytes(
        encode_net([CaffeLayerBlobs("ip1", "InnerProduct", [np.ones((3, 4), np.float32)])])[:-3]
    )
    with pytest.raises(caffemodel.CaffemodelError, match="trunc.caffemodel: truncated or corrupt"):
        load_weights(FakeNet(), tmp_path / "trunc.caffemodel")


LENET = "/work/shared/caffe/lenet_train_test.prototxt"
HAS_NET = importlib.util.find_spec("sparkdp.caffe.net") is not None


@pytest.mark.skipif(not HAS_NET, reason="sparkdp.caffe.net (load_net) is not available yet")
def test_lenet_build_save_load_gives_identical_outputs(tmp_path):
    from sparkdp.caffe.net import load_net

    shapes = {"data": (4, 1, 28, 28)}
    torch.manual_seed(0)
    trained = load_net(LENET, phase="TEST", input_shapes=shapes)
    with torch.no_grad():  # make every blob distinctive (Caffe's default filler would leave zeros)
        for name, _ in trained.caffe_layers:
            for blob in trained.blobs_of(name):
                blob.copy_(torch.randn(blob.shape) * 0.1)
    path = save_weights(trained, tmp_path / "lenet.caffemodel")
    torch.manual_seed(1)
    fresh = load_net(LENET, phase="TEST", input_shapes=shapes)
    summary = load_weights(fresh, path)
    assert set(summary.loaded) == {"conv1", "conv2", "ip1", "ip2"}
    x = torch.rand(4, 1, 28, 28)
    label = torch.tensor([0.0, 1.0, 2.0, 3.0])
    trained.eval()
    fresh.eval()
    out_a, out_b = trained(data=x, label=label), fresh(data=x, label=label)
    assert out_a.keys() == out_b.keys()
    for key in out_a:
        torch.testing.assert_close(out_a[key], out_b[key], rtol=0, atol=0)
    # And a TRAIN-phase net takes the same file (the Data layer shapes differ, weights not).
    train_net = load_net(LENET, phase="TRAIN", input_shapes={"data": (2, 1, 28, 28)})
    assert set(load_weights(train_net, path).loaded) == {"conv1", "conv2", "ip1", "ip2"}
