"""Neuron layers against their Caffe formulas (docs/algorithms.md §9), PReLU and Dropout."""

from __future__ import annotations

import math

import pytest
import torch

X = torch.tensor([[-3.0, -0.5, 0.0, 0.25, 2.0, 30.0]])


@pytest.mark.parametrize(
    ("layer", "formula"),
    [
        ('type: "ReLU"', lambda x: torch.clamp(x, min=0)),
        ('type: "ReLU" relu_param { negative_slope: 0.1 }', lambda x: x.clamp(min=0) + 0.1 * x.clamp(max=0)),
        (
            'type: "ELU" elu_param { alpha: 0.5 }',
            lambda x: x.clamp(min=0) + 0.5 * (torch.exp(x.clamp(max=0)) - 1),
        ),
        ('type: "Sigmoid"', lambda x: 1 / (1 + torch.exp(-x))),
        ('type: "TanH"', torch.tanh),
        ('type: "AbsVal"', torch.abs),
        ('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }', lambda x: (1 + 0.5 * x) ** 2),
        ('type: "Exp"', torch.exp),
        ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', lambda x: 2 ** (1 + 0.5 * x)),
        ('type: "Threshold" threshold_param { threshold: 0.25 }', lambda x: (x > 0.25).float()),
        (
            'type: "BNLL"',
            lambda x: torch.where(x > 0, x + torch.log(1 + torch.exp(-x)), torch.log(1 + torch.exp(x))),
        ),
        ('type: "Clip" clip_param { min: -1 max: 1 }', lambda x: x.clamp(-1, 1)),
        ('type: "Swish" swish_param { beta: 2 }', lambda x: x / (1 + torch.exp(-2 * x))),
    ],
)
def test_neuron_formulas(build, layer, formula):
    net = build(f'layer {{ name: "n" {layer} bottom: "x" top: "x" }}', x=(1, 6))
    torch.testing.assert_close(net(X), formula(X.double()).float())


def test_log_layer(build):
    net = build(
        'layer { name: "n" type: "Log" log_param { base: 10 scale: 2 shift: 1 } bottom: "x" top: "y" }',
        x=(1, 3),
    )
    x = torch.tensor([[0.0, 4.5, 49.5]])
    torch.testing.assert_close(net(x), torch.tensor([[0.0, 1.0, 2.0]]))
    torch.testing.assert_close(
        build('layer { name: "n" type: "Log" bottom: "x" top: "y" }', x=(1, 1))(torch.tensor([[math.e]])),
        torch.tensor([[1.0]]),
    )


def test_relu_gradient_at_zero_takes_slope_side(build):
    net = build(
        'layer { name: "n" type: "ReLU" relu_param { negative_slope: 0.2 } bottom: "x" top: "y" }', x=(3,)
    )
    x = torch.tensor([-1.0, 0.0, 1.0], requires_grad=True)
    net(x).sum().backward()
    assert x.grad.tolist() == pytest.approx([0.2, 0.2, 1.0])


def test_prelu_channelwise_and_shared(build):
    net = build('layer { name: "p" type: "PReLU" bottom: "x" top: "y" }', x=(2, 3, 2, 2))
    (a,) = net.blobs_of("p")
    assert a.shape == (3,) and torch.all(a == 0.25)  # Caffe's default filler: constant 0.25
    with torch.no_grad():
        a.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x = torch.randn(2, 3, 2, 2)
    expected = x.clamp(min=0) + torch.tensor([0.1, 0.2, 0.3]).view(1, 3, 1, 1) * x.clamp(max=0)
    torch.testing.assert_close(net(x), expected)
    shared = build(
        'layer { name: "p" type: "PReLU" bottom: "x" top: "y" prelu_param { channel_shared: true '
        'filler { type: "constant" value: 0.5 } } }',
        x=(2, 3, 2, 2),
    )
    (a,) = shared.blobs_of("p")
    assert a.shape == () and a.item() == 0.5  # Caffe's 0-axis blob
    torch.testing.assert_close(shared(x), x.clamp(min=0) + 0.5 * x.clamp(max=0))


def test_dropout_follows_phase_and_mode(build):
    x = torch.ones(1000)
    text = 'layer { name: "d" type: "Dropout" bottom: "x" top: "y" dropout_param { dropout_ratio: 0.25 } }'
    test_net = build(text, x=(1000,))
    torch.testing.assert_close(test_net(x), x)  # TEST phase: identity even in training mode
    train_net = build(text, phase="TRAIN", x=(1000,))
    y = train_net(x)
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.75))  # inverted scaling
    assert 650 < kept.numel() < 850
    train_net.eval()
    torch.testing.assert_close(train_net(x), x)
