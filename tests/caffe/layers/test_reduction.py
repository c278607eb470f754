"""caffe/layers/reduction.py: Reduction against torch's reductions."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize(
    ("param", "reference"),
    [
        ("", lambda x: x.sum()),
        ("operation: ASUM axis: 1", lambda x: x.abs().sum(dim=(1, 2))),
        ("operation: SUMSQ axis: -1 coeff: 0.5", lambda x: 0.5 * (x * x).sum(dim=2)),
        ("operation: MEAN axis: 1 coeff: -2", lambda x: -2 * x.mean(dim=(1, 2))),
        ("operation: 4 axis: 2", lambda x: x.mean(dim=2)),  # the enum by number: MEAN = 4
    ],
)
def test_reduction_matches_torch(build, param, reference):
    net = build(
        f'layer {{ name: "r" type: "Reduction" bottom: "x" top: "y" reduction_param {{ {param} }} }}',
        x=(2, 3, 4),
    )
    x = torch.randn(2, 3, 4)
    expected = reference(x)
    assert net.blob_shapes["y"] == tuple(expected.shape)
    torch.testing.assert_close(net(x), expected)
