"""caffe/layers/margin.py: ContrastiveLoss and HingeLoss against hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError, DataError

A = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
B = torch.tensor([[3.0, 4.0], [1.0, 0.5], [0.0, 0.2]])
Y = torch.tensor([1.0, 0.0, 0.0])


def _contrastive(build, param=""):
    return build(
        'layer { name: "l" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "y" top: "loss" '
        f"contrastive_loss_param {{ {param} }} }}",
        a=(3, 2),
        b=(3, 2),
        y=(3,),
    )


def test_contrastive_loss_values(build):
    # similar: d² = 25; dissimilar: (1 - 0.5)² = 0.25 and (1 - 0.2)² = 0.64; / (2N) = / 6
    assert _contrastive(build)(A, B, Y).item() == pytest.approx((25 + 0.25 + 0.64) / 6, rel=1e-6)
    # legacy_version: max(margin - d², 0) = 0.75 and 0.96
    assert _contrastive(build, "legacy_version: true")(A, B, Y).item() == pytest.approx(
        (25 + 0.75 + 0.96) / 6, rel=1e-6
    )
    # margin 0.3: only the d = 0.2 pair is inside it: (0.3 - 0.2)² = 0.01
    assert _contrastive(build, "margin: 0.3")(A, B, Y).item() == pytest.approx((25 + 0.01) / 6, rel=1e-5)


def test_contrastive_loss_gradient_is_caffes(build):
    net = _contrastive(build)
    a = A.clone().requires_grad_(True)
    net(a, B, Y).backward()
    # similar pair: d/da (d²/6) = 2(a - b)/6; dissimilar pair 1: -(1/N)·mdist/(d + 1e-4)·(a - b)
    torch.testing.assert_close(a.grad[0], 2 * (A[0] - B[0]) / 6)
    torch.testing.assert_close(a.grad[1], -(1 / 3) * 0.5 / (0.5 + 1e-4) * (A[1] - B[1]))
    # identical features of a dissimilar pair: Caffe's gradient is 0, not NaN
    a = torch.zeros(3, 2, requires_grad=True)
    net(a, torch.zeros(3, 2), torch.zeros(3)).backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() == 0


def test_contrastive_loss_shape_errors(build):
    with pytest.raises(ConfigError, match="one similarity label per pair: 3 pairs"):
        build(
            'layer { name: "l" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "y" top: "loss" }',
            a=(3, 2),
            b=(3, 2),
            y=(2,),
        )
    with pytest.raises(ConfigError, match=r"equal shapes; got \[3, 2\] and \[3, 3\]"):
        build(
            'layer { name: "l" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "y" top: "loss" }',
            a=(3, 2),
            b=(3, 3),
            y=(3,),
        )


@pytest.mark.parametrize(("norm", "expected"), [("", (3.0 + 3.0) / 2), ("norm: L2", (6.5 + 5.0) / 2)])
def test_hinge_loss_values(build, norm, expected):
    net = build(
        f'layer {{ name: "h" type: "HingeLoss" bottom: "x" bottom: "t" top: "loss" hinge_loss_param {{ {norm} }} }}',
        x=(2, 3),
        t=(2,),
    )
    x = torch.tensor([[0.5, -2.0, 1.5], [0.0, -1.0, -1.5]])
    # row 0, label 0: max(0, 1 - 0.5), max(0, 1 - 2), max(0, 1 + 1.5) = 0.5, 0, 2.5
    # row 1, label 1: max(0, 1 + 0), max(0, 1 + 1), max(0, 1 - 1.5) = 1, 2, 0
    # L1 sums them, L2 sums their squares; both divide by N = 2
    assert net(x, torch.tensor([0.0, 1.0])).item() == pytest.approx(expected, rel=1e-6)


def test_hinge_loss_bad_label(build):
    net = build('layer { name: "h" type: "HingeLoss" bottom: "x" bottom: "t" top: "loss" }', x=(1, 3), t=(1,))
    with pytest.raises(DataError, match=r"labels must lie in \[0, 3\); got \[3\]"):
        net(torch.zeros(1, 3), torch.tensor([3.0]))
