"""The pure helpers: pseudo-gradients (section 8) and staleness factors (section 7.3)."""

from __future__ import annotations

import pytest
import torch

from sparkdp.rules import pseudo_gradient, staleness_scale


@pytest.mark.parametrize("k", [1, 3, 8])
def test_pseudo_gradient_of_k_plain_sgd_steps_is_the_mean_gradient(k):
    gen = torch.Generator().manual_seed(k)
    params = [
        torch.nn.Parameter(torch.randn(4, 3, generator=gen)),
        torch.nn.Parameter(torch.randn(3, generator=gen)),
    ]
    pulled = [p.detach().clone() for p in params]
    worker = torch.optim.SGD(params, lr=0.05)
    seen = [[], []]
    for _ in range(k):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=gen)
            seen[i].append(p.grad.clone())
        worker.step()
    got = pseudo_gradient(pulled, list(params), worker_lr=0.05, k=k)
    for i, g in enumerate(got):
        mean = torch.stack(seen[i]).mean(0)
        assert torch.allclose(g, mean, atol=1e-5), f"tensor {i}, k={k}: {g} vs {mean}"
        assert not g.requires_grad


def test_pseudo_gradient_with_one_step_is_the_gradient():
    pulled, grad = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    (got,) = pseudo_gradient([pulled], [pulled - 0.1 * grad], worker_lr=0.1, k=1)
    assert torch.allclose(got, grad)


@pytest.mark.parametrize(
    ("tau", "mode", "scale"),
    [
        (0, "none", 1.0),
        (7, "none", 1.0),
        (0, "inverse", 1.0),
        (1, "inverse", 1.0),
        (4, "inverse", 0.25),
        (0, "dynsgd", 1.0),
        (3, "dynsgd", 0.25),
    ],
)
def test_staleness_scale(tau, mode, scale):
    assert staleness_scale(tau, mode) == scale


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_lr": 0.0, "k": 1}, r"worker_lr.*\(0, inf\).*0\.0"),
        ({"worker_lr": -0.1, "k": 1}, r"worker_lr.*-0\.1"),
        ({"worker_lr": 0.1, "k": 0}, r"k.*integer >= 1.*0"),
    ],
)
def test_pseudo_gradient_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pseudo_gradient([torch.zeros(1)], [torch.zeros(1)], **kwargs)


def test_staleness_scale_rejects_unknown_mode():
    with pytest.raises(ValueError, match="'none', 'dynsgd', 'inverse'"):
        staleness_scale(1, "sqrt")
