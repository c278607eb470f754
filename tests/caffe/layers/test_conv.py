"""caffe/layers/conv.py: Convolution and Deconvolution against torch.nn.functional and Caffe's formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparkdp.errors import ConfigError

from .blobs import set_blobs


def test_convolution_groups_dilation_per_axis(build):
    net = build(
        'layer { name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 6 group: 2 '
        "kernel_size: 3 kernel_size: 2 pad: 2 pad: 0 stride: 2 stride: 1 dilation: 2 dilation: 1 } }",
        x=(2, 4, 9, 7),
    )
    w, b = torch.randn(6, 2, 3, 2), torch.randn(6)
    set_blobs(net, "c", w, b)
    x = torch.randn(2, 4, 9, 7)
    expected = F.conv2d(x, w, b, stride=(2, 1), padding=(2, 0), dilation=(2, 1), groups=2)
    # Caffe: out = (in + 2·pad − (dilation·(k−1)+1)) / stride + 1 = (9+4-5)//2+1 = 5 ; (7-2)//1+1 = 6
    assert net.blob_shapes["y"] == (2, 6, 5, 6) == tuple(expected.shape)
    torch.testing.assert_close(net(x), expected)


def test_convolution_hw_form_no_bias_multi_bottom_and_default_zero_weights(build):
    text = (
        'layer { name: "c" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        "convolution_param { num_output: 3 bias_term: false kernel_h: 1 kernel_w: 3 pad_h: 1 pad_w: 0 stride_h: 2 "
        "stride_w: 1 } }"
    )
    net = build(text, a=(1, 2, 4, 5), b=(1, 2, 4, 5))
    (w,) = net.blobs_of("c")
    assert w.shape == (3, 2, 1, 3) and torch.count_nonzero(w) == 0  # Caffe's default filler: constant 0
    set_blobs(net, "c", torch.randn(3, 2, 1, 3))
    a, b = torch.randn(1, 2, 4, 5), torch.randn(1, 2, 4, 5)
    out = net(a=a, b=b)
    for x, y in ((a, out["ya"]), (b, out["yb"])):
        torch.testing.assert_close(y, F.conv2d(x, w, None, stride=(2, 1), padding=(1, 0)))


def test_convolution_1d_and_axis(build):
    net = build(
        'layer { name: "c" type: "Convolution" bottom: "x" top: "y" '
        "convolution_param { num_output: 2 kernel_size: 2 axis: 2 } }",
        x=(2, 3, 4, 6),
    )
    w, b = torch.randn(2, 4, 2), torch.randn(2)
    set_blobs(net, "c", w, b)
    x = torch.randn(2, 3, 4, 6)
    expected = F.conv1d(x.reshape(6, 4, 6), w, b).reshape(2, 3, 2, 5)
    torch.testing.assert_close(net(x), expected)


def test_deconvolution(build):
    net = build(
        'layer { name: "d" type: "Deconvolution" bottom: "x" top: "y" '
        "convolution_param { num_output: 4 group: 2 kernel_size: 4 stride: 2 pad: 1 } }",
        x=(1, 2, 5, 5),
    )
    w, b = torch.randn(2, 2, 4, 4), torch.randn(4)
    assert [tuple(t.shape) for t in net.blobs_of("d")] == [(2, 2, 4, 4), (4,)]
    set_blobs(net, "d", w, b)
    x = torch.randn(1, 2, 5, 5)
    # Caffe: out = stride·(in−1) + dilation·(k−1) + 1 − 2·pad = 8 + 4 − 2 = 10
    assert net.blob_shapes["y"] == (1, 4, 10, 10)
    torch.testing.assert_close(net(x), F.conv_transpose2d(x, w, b, stride=2, padding=1, groups=2))


@pytest.mark.parametrize(
    ("param", "message"),
    [
        (
            "num_output: 3 kernel_size: 3 group: 2",
            r"input channels \(4\) and num_output \(3\) must be positive and divisible",
        ),
        ("num_output: 2", "needs kernel_size"),
        (
            "num_output: 2 kernel_size: 3 kernel_h: 3 kernel_w: 3",
            "give either kernel_size or kernel_h/kernel_w",
        ),
        ("num_output: 2 kernel_size: 9", "too small for kernel"),
        ("kernel_size: 3", "num_output is required"),
    ],
)
def test_convolution_errors(build, param, message):
    with pytest.raises(ConfigError, match=message):
        build(
            f'layer {{ name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param {{ {param} }} }}',
            x=(1, 4, 5, 5),
        )


def test_im2col_times_weights_is_convolution(build):
    net = build(
        'layer { name: "c" type: "Im2col" bottom: "x" top: "cols" '
        "convolution_param { kernel_size: 3 stride: 2 pad: 1 dilation: 1 } }",
        x=(2, 3, 7, 6),
    )
    x, w = torch.randn(2, 3, 7, 6), torch.randn(5, 3, 3, 3)
    cols = net(x)
    assert net.blob_shapes["cols"] == (2, 27, 4, 3) == tuple(cols.shape)
    conv = torch.einsum("ok,nkhw->nohw", w.reshape(5, 27), cols)
    torch.testing.assert_close(conv, F.conv2d(x, w, stride=2, padding=1), rtol=1e-4, atol=1e-5)


def test_im2col_hand_worked():
    from sparkdp.caffe.net import load_net

    net = load_net(
        'layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 dim: 1 dim: 2 dim: 3 } } }'
        'layer { name: "c" type: "Im2col" bottom: "x" top: "y" convolution_param { kernel_size: 2 } }'
    )
    x = torch.tensor([[[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]]])
    # two 2x2 windows; rows are (kernel row, kernel column): the windows' [1, 2, 4, 5] and [2, 3, 5, 6]
    expected = torch.tensor([[1.0, 2.0], [2.0, 3.0], [4.0, 5.0], [5.0, 6.0]]).reshape(1, 4, 1, 2)
    torch.testing.assert_close(net(x), expected)
