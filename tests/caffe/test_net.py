"""Whole nets: the example files, V1 vs V2, blob wiring, parameters, losses and errors."""

from __future__ import annotations

import pytest
import torch

from sparkdp.caffe import load_net
from sparkdp.errors import ConfigError

V1_LENET = """
name: "LeNet"
input: "data"
input_dim: 64 input_dim: 1 input_dim: 28 input_dim: 28
layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 20 kernel_size: 5 stride: 1 weight_filler { type: "xavier" }
                      bias_filler { type: "constant" } } }
layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "conv2" type: CONVOLUTION bottom: "pool1" top: "conv2" blobs_lr: 1 blobs_lr: 2
  convolution_param { num_output: 50 kernel_size: 5 stride: 1 weight_filler { type: "xavier" }
                      bias_filler { type: "constant" } } }
layers { name: "pool2" type: POOLING bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layers { name: "ip1" type: INNER_PRODUCT bottom: "pool2" top: "ip1" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 500 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layers { name: "relu1" type: RELU bottom: "ip1" top: "ip1" }
layers { name: "ip2" type: INNER_PRODUCT bottom: "ip1" top: "ip2" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layers { name: "prob" type: SOFTMAX bottom: "ip2" top: "prob" }
"""


def _count(net) -> int:
    return sum(p.numel() for p in net.parameters())


def test_lenet_deploy(examples):
    net = load_net(examples / "lenet.prototxt", phase="TEST")
    # conv1 20·1·5·5+20, conv2 50·20·5·5+50, ip1 500·800+500, ip2 10·500+10
    assert _count(net) == 520 + 25_050 + 400_500 + 5_010 == 431_080
    assert net.input_names == ["data"] and net.output_names == ["prob"]
    assert net.caffe_layers[:3] == [("data", "Input"), ("conv1", "Convolution"), ("pool1", "Pooling")]
    prob = net(torch.rand(64, 1, 28, 28))
    assert prob.shape == (64, 10)
    torch.testing.assert_close(prob.sum(1), torch.ones(64))
    assert [tuple(b.shape) for b in net.blobs_of("conv1")] == [(20, 1, 5, 5), (20,)]
    assert [tuple(b.shape) for b in net.blobs_of("ip1")] == [(500, 800), (500,)]
    assert net.blobs_of("relu1") == [] and net.blobs_of("data") == []


def test_cifar10_quick_counts_by_hand(examples):
    net = load_net(examples / "cifar10_quick.prototxt", phase="TEST")
    # CEIL pooling 3/2: 32 -> ceil(29/2)+1 = 16 -> ceil(13/2)+1 = 8 -> ceil(5/2)+1 = 4, so ip1 sees 64·4·4.
    conv1, conv2, conv3 = 32 * 3 * 25 + 32, 32 * 32 * 25 + 32, 64 * 32 * 25 + 64
    ip1, ip2 = 64 * 1024 + 64, 10 * 64 + 10
    assert (conv1, conv2, conv3, ip1, ip2) == (2_432, 25_632, 51_264, 65_600, 650)
    assert _count(net) == 145_578
    shapes = {row["name"]: row["top_shapes"][0] for row in net.layer_rows()}
    assert (shapes["pool1"], shapes["pool2"], shapes["pool3"]) == (
        [1, 32, 16, 16],
        [1, 32, 8, 8],
        [1, 64, 4, 4],
    )
    assert net(torch.zeros(1, 3, 32, 32)).shape == (1, 10)


def test_train_test_phases(examples):
    path = examples / "lenet_train_test.prototxt"
    with pytest.raises(
        ConfigError,
        match=r"lenet_train_test\.prototxt:2:7: layer 'mnist' \(type Data\).*"
        r"pass input_shapes=\{'data': \(64, C, H, W\)\}",
    ):
        load_net(path, phase="TRAIN")
    train = load_net(path, phase="TRAIN", input_shapes={"data": (1, 28, 28)})  # C, H, W: batch from the file
    test = load_net(path, phase="TEST", input_shapes={"data": (1, 28, 28)})
    assert train.input_shapes == {"data": (64, 1, 28, 28), "label": (64,)}
    assert test.input_shapes == {"data": (100, 1, 28, 28), "label": (100,)}
    assert train.output_names == ["loss"] and test.output_names == ["accuracy", "loss"]
    assert train.loss_weights == {"loss": 1.0} and test.loss_names == ["loss"]
    assert [name for name, _ in test.caffe_layers] == [
        "mnist",
        "conv1",
        "pool1",
        "conv2",
        "pool2",
        "ip1",
        "relu1",
        "ip2",
        "accuracy",
        "loss",
    ]
    out = train(torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,)).float())
    assert out.shape == () and train.loss(out) == out
    out.backward()
    assert train.blobs_of("conv1")[0].grad is not None


def test_v1_and_v2_build_the_same_module(examples):
    torch.manual_seed(3)
    v2 = load_net(examples / "lenet.prototxt")
    torch.manual_seed(3)
    v1 = load_net(V1_LENET)
    assert v1.caffe_layers[0] == ("input", "Input") and v1.caffe_layers[1:] == v2.caffe_layers[1:]
    s1, s2 = v1.state_dict(), v2.state_dict()
    assert list(s1) == list(s2)
    for key in s1:
        torch.testing.assert_close(s1[key], s2[key], rtol=0, atol=0)
    x = torch.rand(64, 1, 28, 28)
    torch.testing.assert_close(v1(x), v2(x), rtol=0, atol=0)
    assert [(g["lr"], g["names"]) for g in v1.param_groups(0.1)] == [
        (g["lr"], g["names"]) for g in v2.param_groups(0.1)
    ]


def test_in_place_rebinding_and_outputs(build):
    net = build(
        """
        layer { name: "double" type: "Power" bottom: "x" top: "a" power_param { scale: 2 } }
        layer { name: "abs" type: "AbsVal" bottom: "a" top: "k" }
        layer { name: "relu" type: "ReLU" bottom: "a" top: "a" }
        layer { name: "sum" type: "Eltwise" bottom: "k" bottom: "a" top: "s" }
        layer { name: "neg" type: "Power" bottom: "a" top: "n" power_param { scale: -1 } }
        """,
        x=(2, 3),
    )
    assert net.output_names == ["s", "n"]  # 'k' and the in-place 'a' are consumed later
    x = torch.tensor([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], requires_grad=True)
    out = net(x=x)
    a = torch.relu(2 * x)
    torch.testing.assert_close(out["s"], (2 * x).abs() + a)
    torch.testing.assert_close(out["n"], -a)
    (out["s"].sum() + out["n"].sum()).backward()  # autograd sums the split gradients
    torch.testing.assert_close(x.grad, 2 * torch.sign(x))


def test_wiring_errors(build):
    with pytest.raises(
        ConfigError,
        match=r"layer 'r' \(type ReLU\) reads bottom blob 'dat', which no earlier layer "
        r"of the TEST net produces\. Did you mean 'data'\?",
    ):
        build('layer { name: "r" type: "ReLU" bottom: "dat" top: "r" }', data=(1, 2))
    with pytest.raises(ConfigError, match="top blob 'data' is produced by multiple sources"):
        build(
            'layer { name: "r" type: "AbsVal" bottom: "data" top: "r" }'
            'layer { name: "s" type: "AbsVal" bottom: "r" top: "data" }',
            data=(1, 2),
        )
    with pytest.raises(
        ConfigError,
        match=r"has type 'Frobnicate', which sparkdp cannot convert\. Supported types: .*Convolution",
    ):
        build('layer { name: "l" type: "Frobnicate" bottom: "data" top: "y" }', data=(1, 2))
    with pytest.raises(ConfigError, match=r"Did you mean 'ReLU'\? \(type names are case-sensitive\)"):
        build('layer { name: "l" type: "Relu" bottom: "data" top: "y" }', data=(1, 2))
    with pytest.raises(ConfigError, match=r"'SoftmaxLoss'.*Did you mean 'SoftmaxWithLoss'"):
        build('layer { name: "l" type: "SoftmaxLoss" bottom: "data" top: "y" }', data=(1, 2))
    with pytest.raises(
        ConfigError,
        match=r"layer 'py' is a Python layer \(module 'my_layers', layer 'Odd'\).*own Python code",
    ):
        build(
            'layer { name: "py" type: "Python" bottom: "data" top: "y" '
            'python_param { module: "my_layers" layer: "Odd" } }',
            data=(1, 2),
        )
    with pytest.raises(ConfigError, match=r"type 'HDF5Output': it writes its bottoms to an HDF5 file"):
        build('layer { name: "o" type: "HDF5Output" bottom: "data" }', data=(1, 2))
    with pytest.raises(ConfigError, match=r"type 'WindowData': R-CNN's window-file layer"):
        build('layer { name: "w" type: "WindowData" top: "d" top: "l" }', data=(1, 2))
    with pytest.raises(ConfigError, match="gives 3 param specs but has only 2"):
        build(
            'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "y" param {} param {} param {} '
            "inner_product_param { num_output: 1 } }",
            data=(1, 2),
        )
    with pytest.raises(ConfigError, match=r"input_shapes names \['nope'\]"):
        load_net(
            'layer { name: "i" type: "Input" top: "x" input_param { shape { dim: 1 } } }',
            input_shapes={"nope": (1,)},
        )


def test_shape_mismatch_names_layer_and_shapes(build):
    with pytest.raises(
        ConfigError,
        match=r"layer 'sum' \(type Eltwise\): bottom 'b' has shape \[2, 4\] but bottom "
        r"'a' has shape \[2, 3\]",
    ):
        build('layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }', a=(2, 3), b=(2, 4))


def test_forward_inputs(build):
    net = build('layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }', a=(2,), b=(2,))
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])
    torch.testing.assert_close(net(a, b), net(a=a, b=b))
    torch.testing.assert_close(net(a, b=b), a + b)
    with pytest.raises(ConfigError, match="missing input 'b'"):
        net(a)
    with pytest.raises(ConfigError, match=r"unknown inputs \['c'\]"):
        net(a, b, c=a)
    with pytest.raises(ConfigError, match="given both by position and by name"):
        net(a, a=a, b=b)


def test_lr_mult_decay_mult_and_param_groups(build):
    net = build(
        """
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
                param { lr_mult: 0 } param { lr_mult: 2 decay_mult: 0 } inner_product_param { num_output: 2 } }
        layer { name: "ip2" type: "InnerProduct" bottom: "y" top: "z" inner_product_param { num_output: 1 } }
        """,
        x=(1, 3),
    )
    weight, bias = net.blobs_of("ip")
    assert not weight.requires_grad and bias.requires_grad
    groups = net.param_groups(0.1, weight_decay=0.01)
    summary = [(g["names"], g["lr"], g["weight_decay"]) for g in groups]
    assert summary == [(["layers.ip.bias"], 0.2, 0.0), (["layers.ip2.weight", "layers.ip2.bias"], 0.1, 0.01)]
    torch.optim.SGD(groups, lr=0.1)  # valid torch param groups
    assert [(n, lr, d) for n, _, lr, d in net.learnable_params()][0] == ("layers.ip.weight", 0.0, 1.0)


def test_shared_params(build):
    text = """
        layer { name: "a" type: "InnerProduct" bottom: "x" top: "ya" param { name: "w" lr_mult: 1 } param { name: "b" }
                inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
        layer { name: "b" type: "InnerProduct" bottom: "x2" top: "yb" param { name: "w" } param { name: "b" lr_mult: 3 }
                inner_product_param { num_output: 2 } }
        """
    net = build(text, x=(1, 3), x2=(1, 3))
    wa, ba = net.blobs_of("a")
    wb, bb = net.blobs_of("b")
    assert wa is wb and ba is bb
    assert len(list(net.parameters())) == 2
    assert [(n, lr) for n, _, lr, _ in net.learnable_params()] == [
        ("layers.a.weight", 1.0),
        ("layers.a.bias", 3.0),
    ]
    x, x2 = torch.rand(1, 3), torch.rand(1, 3)
    out = net(x=x, x2=x2)
    (out["ya"].sum() + out["yb"].sum()).backward()
    torch.testing.assert_close(wa.grad, (x + x2).expand(2, 3))  # gradients from both users accumulate
    with pytest.raises(
        ConfigError,
        match=r"shares param 'w' with shape \[2, 4\], but its owner layers\.a\.weight "
        r"has shape \[2, 3\]",
    ):
        build(text, x=(1, 3), x2=(1, 4))
    with pytest.raises(ConfigError, match="sets lr_mult 5 on shared param 'w', but it is already 1"):
        build(text.replace('param { name: "w" }', 'param { name: "w" lr_mult: 5 }'), x=(1, 3), x2=(1, 3))


def test_loss_weights_and_loss(build):
    net = build(
        """
        layer { name: "e" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "l1" loss_weight: 0.5 }
        layer { name: "d" type: "Eltwise" bottom: "a" bottom: "b" top: "diff" eltwise_param { coeff: 1 coeff: -1 }
                loss_weight: 2 }
        layer { name: "s" type: "SoftmaxWithLoss" bottom: "a" bottom: "lab" top: "l2" }
        """,
        a=(2, 3),
        b=(2, 3),
        lab=(2,),
    )
    assert net.loss_weights == {"l1": 0.5, "diff": 2.0, "l2": 1.0}
    a, b, lab = torch.rand(2, 3), torch.rand(2, 3), torch.tensor([0.0, 2.0])
    out = net(a=a, b=b, lab=lab)
    expected = (
        0.5 * ((a - b) ** 2).sum() / 4 + 2 * (a - b).sum() + torch.nn.functional.cross_entropy(a, lab.long())
    )
    torch.testing.assert_close(net.loss(out), expected)
    plain = build('layer { name: "r" type: "ReLU" bottom: "a" top: "r" }', a=(2,))
    with pytest.raises(ConfigError, match="has no loss top"):
        plain.loss(plain(torch.zeros(2)))


def test_blobs_of_is_live(build):
    net = build(
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 1 } }',
        x=(1, 2),
    )
    assert net(torch.ones(1, 2)).item() == 0.0  # default fillers are constant 0
    with torch.no_grad():
        for blob, value in zip(net.blobs_of("ip"), ([[1.0, 2.0]], [0.5]), strict=True):
            blob.copy_(torch.tensor(value))
    assert net(torch.ones(1, 2)).item() == 3.5
    with pytest.raises(ConfigError, match="no layer named 'nope'"):
        net.blobs_of("nope")


def test_data_sources():
    text = """
    layer { name: "img" type: "ImageData" top: "data" top: "label" transform_param { crop_size: 5 }
            image_data_param { source: "list.txt" batch_size: 4 } }
    layer { name: "mem" type: "MemoryData" top: "m" top: "ml"
            memory_data_param { batch_size: 2 channels: 1 height: 3 width: 4 } }
    layer { name: "h5" type: "HDF5Data" top: "h" hdf5_data_param { source: "files.txt" batch_size: 8 } }
    layer { name: "dummy" type: "DummyData" top: "d1" top: "d2"
            dummy_data_param { shape { dim: 2 dim: 2 } data_filler { type: "constant" value: 3 } } }
    """
    with pytest.raises(ConfigError, match=r"dataset 'h' has a shape only the HDF5 file knows"):
        load_net(text)
    net = load_net(text, input_shapes={"h": (8, 7)})
    assert net.input_shapes == {
        "data": (4, 3, 5, 5),
        "label": (4,),
        "m": (2, 1, 3, 4),
        "ml": (2,),
        "h": (8, 7),
        "d1": (2, 2),
        "d2": (2, 2),
    }
    fed = {name: torch.zeros(shape) for name, shape in net.input_shapes.items() if name not in ("d1", "d2")}
    out = net(**fed)
    torch.testing.assert_close(out["d1"], torch.full((2, 2), 3.0))  # DummyData fills itself when not fed
    torch.testing.assert_close(net(**fed, d2=torch.ones(2, 2))["d2"], torch.ones(2, 2))
    with pytest.raises(ConfigError, match="HDF5Data does not transform data"):
        load_net('layer { name: "h" type: "HDF5Data" top: "h" transform_param { scale: 2 } }')


def test_user_guide_lists_every_supported_layer_type():
    from pathlib import Path

    from sparkdp.caffe.layers import SUPPORTED

    guide = (Path(__file__).parents[2] / "docs" / "guide" / "caffe.md").read_text()
    missing = [t for t in SUPPORTED if f"`{t}`" not in guide]
    assert not missing, f"docs/guide/caffe.md does not list {missing}"
