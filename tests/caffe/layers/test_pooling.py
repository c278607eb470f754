"""Pooling against a numpy port of Caffe's CPU loops (``PoolingLayer::Forward_cpu``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdp.caffe.layers.pooling import pooled_size
from sparkdp.errors import ConfigError

FLT_MAX = np.finfo(np.float32).max


def caffe_pool(x: np.ndarray, k: int, s: int, p: int, method: str, ceil: bool = True):
    """Literal port of Caffe's loops: returns (top, mask)."""
    n, c, h, w = x.shape

    def out(size):
        f = math.ceil if ceil else math.floor
        o = int(f((size + 2 * p - k) / s)) + 1
        if p and (o - 1) * s >= size + p:
            o -= 1
        return o

    ph, pw = out(h), out(w)
    top = np.zeros((n, c, ph, pw), np.float64)
    mask = np.full((n, c, ph, pw), -1.0)
    for i in range(ph):
        for j in range(pw):
            hs, ws = i * s - p, j * s - p
            he, we = min(hs + k, h + p), min(ws + k, w + p)
            pool_size = (he - hs) * (we - ws)
            hs0, ws0, he0, we0 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            for a in range(n):
                for b in range(c):
                    if method == "MAX":
                        best, idx = -FLT_MAX, -1
                        for y in range(hs0, he0):
                            for z in range(ws0, we0):
                                if x[a, b, y, z] > best:
                                    best, idx = x[a, b, y, z], y * w + z
                        top[a, b, i, j], mask[a, b, i, j] = best, idx
                    else:
                        total = x[a, b, hs0:he0, ws0:we0].sum()
                        top[a, b, i, j] = total / pool_size if pool_size else np.nan
    return top, mask


def _pool_net(build, h, w, k, s, p, method, extra="", tops='top: "y"'):
    return build(
        f'layer {{ name: "pool" type: "Pooling" bottom: "x" {tops} '
        f"pooling_param {{ pool: {method} kernel_size: {k} stride: {s} pad: {p} {extra} }} }}",
        x=(2, 3, h, w),
    )


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize(
    ("h", "w", "k", "s", "p"),
    [
        (7, 6, 3, 2, 0),  # ceil and floor differ
        (32, 32, 3, 2, 0),  # cifar10 pool: 16 (floor would give 15)
        (5, 5, 3, 2, 1),  # AVE divisor counts padding at the borders
        (6, 7, 4, 3, 1),  # ceil overhang beyond H + pad not counted
        (5, 5, 3, 1, 2),  # pad > k/2: torch refuses this
        (6, 6, 2, 1, 1),
        (5, 4, 3, 3, 2),  # clip rule: last window would start in the right padding
    ],
)
def test_matches_caffe_loops(build, method, h, w, k, s, p):
    torch.manual_seed(h * 100 + k)
    x = torch.randn(2, 3, h, w)
    net = _pool_net(build, h, w, k, s, p, method)
    expected, _ = caffe_pool(x.double().numpy(), k, s, p, method)
    got = net(x)
    assert tuple(got.shape) == expected.shape == net.blob_shapes["y"]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_extra_window_outside_input_is_caffe_exact(build):
    # H=4, k=3, s=4, pad 0: Caffe makes 2 windows, the second starts at row 4 (outside): an empty
    # MAX window keeps -FLT_MAX and an empty AVE window divides 0 by 0.  torch gives 1 window.
    x = torch.arange(16.0).reshape(1, 1, 4, 4).expand(2, 3, 4, 4)
    top_max = _pool_net(build, 4, 4, 3, 4, 0, "MAX")(x)
    assert top_max.shape == (2, 3, 2, 2)
    assert F.max_pool2d(x, 3, 4, 0, ceil_mode=True).shape == (2, 3, 1, 1)
    m = -float(FLT_MAX)
    assert top_max[0, 0].tolist() == [[10.0, m], [m, m]]  # windows [0, 3) and [4, 4) (empty) per axis
    top_ave = _pool_net(build, 4, 4, 3, 4, 0, "AVE")(x)
    assert top_ave[0, 0, 0, 0].item() == pytest.approx((0 + 1 + 2 + 4 + 5 + 6 + 8 + 9 + 10) / 9)
    assert torch.isnan(top_ave[0, 0, 1, 1])
    h4 = torch.zeros(1, 1, 5, 5)  # H=5, k=2, s=4: second window [4, 6) clipped to row 4, divisor 1
    net = build(
        'layer { name: "p" type: "Pooling" bottom: "x" top: "y" '
        "pooling_param { pool: AVE kernel_size: 2 stride: 4 } }",
        x=(1, 1, 5, 5),
    )
    h4[0, 0, 4, 4] = 8.0
    assert net(h4)[0, 0, 1, 1].item() == 8.0


def test_empty_max_window_value_is_minus_flt_max(build):
    x = torch.ones(2, 3, 4, 4)
    net = _pool_net(build, 4, 4, 3, 4, 0, "MAX")
    expected, _ = caffe_pool(x.double().numpy(), 3, 4, 0, "MAX")
    assert expected[0, 0, 1, 1] == -FLT_MAX
    np.testing.assert_allclose(net(x).numpy(), expected, rtol=1e-6)


def test_matches_torch_where_torch_can(build):
    x = torch.randn(2, 3, 9, 9)
    net = _pool_net(build, 9, 9, 3, 2, 1, "AVE")
    torch.testing.assert_close(net(x), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True))
    net = _pool_net(build, 9, 9, 3, 2, 1, "MAX")
    torch.testing.assert_close(net(x), F.max_pool2d(x, 3, 2, 1, ceil_mode=True))


def test_floor_mode_and_mask_top(build):
    x = torch.randn(2, 3, 7, 7)
    floor = _pool_net(build, 7, 7, 2, 2, 0, "MAX", extra="round_mode: FLOOR")
    assert floor(x).shape == (2, 3, 3, 3)
    torch.testing.assert_close(floor(x), F.max_pool2d(x, 2, 2))
    masked = _pool_net(build, 7, 7, 3, 2, 1, "MAX", tops='top: "y" top: "mask"')
    out = masked(x)
    expected, mask = caffe_pool(x.double().numpy(), 3, 2, 1, "MAX")
    np.testing.assert_allclose(out["y"].numpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(out["mask"].numpy(), mask)


def test_global_pooling_and_rectangular_kernel(build):
    x = torch.randn(2, 3, 5, 4)
    net = build(
        'layer { name: "g" type: "Pooling" bottom: "x" top: "y" pooling_param { pool: AVE global_pooling: true } }',
        x=(2, 3, 5, 4),
    )
    torch.testing.assert_close(net(x), x.mean(dim=(2, 3), keepdim=True))
    net = build(
        'layer { name: "r" type: "Pooling" bottom: "x" top: "y" '
        "pooling_param { kernel_h: 2 kernel_w: 1 stride_h: 2 stride_w: 1 } }",
        x=(2, 3, 5, 4),
    )
    expected = torch.stack([x[:, :, 0:2].amax(2), x[:, :, 2:4].amax(2), x[:, :, 4:5].amax(2)], dim=2)
    torch.testing.assert_close(net(x), expected)


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("pool: STOCHASTIC kernel_size: 2", "STOCHASTIC pooling is not supported"),
        ("kernel_size: 2 kernel_h: 2 kernel_w: 2", "give kernel_size or both kernel_h and kernel_w"),
        ("stride: 2", "needs kernel_size"),
        ("kernel_size: 2 pad: 2", r"pad \[2, 2\] must be smaller than kernel \[2, 2\]"),
        ("global_pooling: true pad: 1", "global_pooling needs pad 0 and stride 1"),
        ("pool: MAXX kernel_size: 2", "pool must be one of MAX, AVE, STOCHASTIC; got 'MAXX'"),
    ],
)
def test_errors(build, param, message):
    with pytest.raises(ConfigError, match=message):
        build(
            f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param {{ {param} }} }}',
            x=(1, 1, 4, 4),
        )


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 12),
    k=st.integers(1, 5),
    s=st.integers(1, 4),
    data=st.data(),
    method=st.sampled_from(["MAX", "AVE"]),
    ceil=st.booleans(),
)
def test_property_matches_caffe_loops(size, k, s, data, method, ceil):
    p = data.draw(st.integers(0, k - 1))
    if size + 2 * p < k:
        return
    from sparkdp.caffe import load_net

    mode = "CEIL" if ceil else "FLOOR"
    net = load_net(
        f'layer {{ name: "i" type: "Input" top: "x" input_param {{ shape {{ dim: 1 dim: 2 dim: {size} dim: {size} }} }} }}'
        f'layer {{ name: "p" type: "Pooling" bottom: "x" top: "y" pooling_param {{ pool: {method} kernel_size: {k} '
        f"stride: {s} pad: {p} round_mode: {mode} }} }}"
    )
    x = torch.randn(1, 2, size, size)
    expected, _ = caffe_pool(x.double().numpy(), k, s, p, method, ceil)
    assert pooled_size(size, k, s, p, ceil) == expected.shape[2]
    np.testing.assert_allclose(net(x).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("size", "method"), [(8, "MAX"), (5, "MAX"), (5, "AVE"), (13, "AVE")])
def test_spp_levels_are_caffe_poolings_concatenated(build, size, method):
    net = build(
        f'layer {{ name: "spp" type: "SPP" bottom: "x" top: "y" spp_param {{ pyramid_height: 3 pool: {method} }} }}',
        x=(2, 3, size, size),
    )
    x = torch.randn(2, 3, size, size)
    parts = []
    for level in range(
        3
    ):  # Caffe's SPP geometry: kernel ceil(H/bins), stride = kernel, pad (k·bins - H + 1)//2
        bins = 2**level
        k = math.ceil(size / bins)
        top, _ = caffe_pool(x.double().numpy(), k, k, (k * bins - size + 1) // 2, method)
        parts.append(torch.from_numpy(top).float().flatten(1))
    expected = torch.cat(parts, dim=1)
    assert net.blob_shapes["y"] == tuple(expected.shape)
    torch.testing.assert_close(net(x), expected)
    if size == 8:  # divisible sizes: the levels are torch's adaptive pooling at 1, 2 and 4 bins
        adaptive = torch.cat([F.adaptive_max_pool2d(x, b).flatten(1) for b in (1, 2, 4)], dim=1)
        torch.testing.assert_close(net(x), adaptive)


def test_spp_single_level_keeps_pooling_shape_and_errors(build):
    net = build(
        'layer { name: "spp" type: "SPP" bottom: "x" top: "y" spp_param { pyramid_height: 1 } }',
        x=(1, 2, 4, 4),
    )
    x = torch.randn(1, 2, 4, 4)
    torch.testing.assert_close(net(x), x.amax(dim=(2, 3), keepdim=True))
    with pytest.raises(ConfigError, match="pyramid_height: L"):
        build('layer { name: "spp" type: "SPP" bottom: "x" top: "y" }', x=(1, 2, 4, 4))
