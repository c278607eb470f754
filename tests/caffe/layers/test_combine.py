"""caffe/layers/combine.py: Eltwise, Concat, Slice, Split, Silence and Crop (with Flatten)."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError


def test_eltwise_sum_coeff_prod(build):
    a, b, c = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    net = build(
        'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "y" '
        "eltwise_param { coeff: 1 coeff: -1 coeff: 0.5 } }",
        a=(2, 3),
        b=(2, 3),
        c=(2, 3),
    )
    torch.testing.assert_close(net(a, b, c), a - b + 0.5 * c)
    net = build(
        'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "y" eltwise_param { operation: PROD } }',
        a=(2, 3),
        b=(2, 3),
    )
    torch.testing.assert_close(net(a, b), a * b)
    with pytest.raises(ConfigError, match="coeff applies to operation SUM only"):
        build(
            'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "y" '
            "eltwise_param { operation: MAX coeff: 1 coeff: 1 } }",
            a=(1,),
            b=(1,),
        )
    with pytest.raises(ConfigError, match=r"needs one coeff per bottom \(2\); got 1"):
        build(
            'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" top: "y" eltwise_param { coeff: 1 } }',
            a=(1,),
            b=(1,),
        )


def test_eltwise_max_tie_gradient_goes_to_one_input(build):
    net = build(
        'layer { name: "e" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "y" '
        "eltwise_param { operation: MAX } }",
        a=(3,),
        b=(3,),
        c=(3,),
    )
    a = torch.tensor([1.0, 2.0, 5.0], requires_grad=True)
    b = torch.tensor([1.0, 3.0, 1.0], requires_grad=True)
    c = torch.tensor([0.0, 3.0, 5.0], requires_grad=True)
    y = net(a, b, c)
    assert y.tolist() == [1.0, 3.0, 5.0]
    y.sum().backward()
    # a vs b tie -> b; later bottoms win only when strictly greater (c ties lose).
    assert a.grad.tolist() == [0.0, 0.0, 1.0]
    assert b.grad.tolist() == [1.0, 1.0, 0.0]
    assert c.grad.tolist() == [0.0, 0.0, 0.0]


def test_concat_and_slice_axes(build):
    net = build(
        'layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "y" concat_param { axis: -1 } }',
        a=(2, 3, 1),
        b=(2, 3, 2),
    )
    a, b = torch.randn(2, 3, 1), torch.randn(2, 3, 2)
    torch.testing.assert_close(net(a, b), torch.cat([a, b], dim=2))
    legacy = build(
        'layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "y" concat_param { concat_dim: 0 } }',
        a=(1, 3),
        b=(2, 3),
    )
    assert legacy.blob_shapes["y"] == (3, 3)
    with pytest.raises(
        ConfigError,
        match=r"bottom 'b' has shape \[2, 4\] but bottom 'a' has shape \[2, 3\]; all dims "
        r"except axis 0 must match",
    ):
        build(
            'layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "y" concat_param { axis: 0 } }',
            a=(2, 3),
            b=(2, 4),
        )
    x = torch.arange(12.0).reshape(2, 6)
    net = build(
        'layer { name: "s" type: "Slice" bottom: "x" top: "p" top: "q" top: "r" '
        "slice_param { slice_point: 1 slice_point: 4 } }",
        x=(2, 6),
    )
    out = net(x)
    assert [out[k].shape[1] for k in "pqr"] == [1, 3, 2]
    torch.testing.assert_close(out["q"], x[:, 1:4])
    equal = build(
        'layer { name: "s" type: "Slice" bottom: "x" top: "p" top: "q" slice_param { slice_dim: 0 } }',
        x=(2, 6),
    )
    torch.testing.assert_close(equal(x)["q"], x[1:])
    with pytest.raises(ConfigError, match="cannot split axis 1 of size 6 equally into 4 tops"):
        build('layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" top: "d" }', x=(2, 6))
    with pytest.raises(ConfigError, match="must increase strictly"):
        build(
            'layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" slice_param { slice_point: 6 } }',
            x=(2, 6),
        )


def test_split_silence_flatten(build):
    net = build(
        """
        layer { name: "sp" type: "Split" bottom: "x" top: "a" top: "b" }
        layer { name: "f" type: "Flatten" bottom: "a" top: "fa" flatten_param { axis: 1 end_axis: 2 } }
        layer { name: "quiet" type: "Silence" bottom: "b" }
        """,
        x=(2, 3, 4, 5),
    )
    assert net.output_names == ["fa"]
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(net(x), x.reshape(2, 12, 5))


def test_crop(build):
    net = build(
        'layer { name: "c" type: "Crop" bottom: "a" bottom: "b" top: "y" crop_param { axis: 2 offset: 1 offset: 2 } }',
        a=(1, 2, 6, 7),
        b=(1, 1, 3, 4),
    )
    a = torch.randn(1, 2, 6, 7)
    y = net(a, torch.zeros(1, 1, 3, 4))
    torch.testing.assert_close(y, a[:, :, 1:4, 2:6])
    with pytest.raises(ConfigError, match="cannot crop axis 2 of size 6 at offset 5 to size 3"):
        build(
            'layer { name: "c" type: "Crop" bottom: "a" bottom: "b" top: "y" crop_param { offset: 5 } }',
            a=(1, 2, 6, 7),
            b=(1, 1, 3, 4),
        )
