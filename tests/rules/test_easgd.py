"""EASGD (async) and DeepSpark's variant against the equations of docs/algorithms.md §5."""

from __future__ import annotations

import pytest
import torch

from sparkdp.rules import EASGD, RULES, Locking, Push


@pytest.mark.parametrize("num_workers", [1, 2, 6, 16])
def test_alpha_defaults_to_beta_over_p(num_workers):
    assert EASGD(num_workers=num_workers).alpha == pytest.approx(0.9 / num_workers)
    assert RULES.create("easgd", num_workers=num_workers).alpha == pytest.approx(0.9 / num_workers)


def test_one_exchange_conserves_worker_plus_centre():
    gen = torch.Generator().manual_seed(1)
    x = [torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)]
    centre = [torch.randn(4, 3, generator=gen), torch.randn(5, generator=gen)]
    before = [a + b for a, b in zip(x, centre, strict=True)]
    rule = EASGD(num_workers=3)
    pulled = [c.clone() for c in centre]
    e = rule.make_push(x, pulled, grads=[])
    rule.apply(centre, Push(worker=0, staleness=0, tensors=tuple(e)))
    rule.merge(x, [c.clone() for c in centre])  # no-op: the worker keeps its own weights
    for i, (a, b, s) in enumerate(zip(x, centre, before, strict=True)):
        assert torch.allclose(a + b, s, atol=1e-6), f"tensor {i}: x + centre changed"


def test_async_exchange_hand_numbers():
    rule = EASGD(alpha=0.25)
    x, centre = [torch.tensor([4.0, -2.0])], [torch.tensor([0.0, 2.0])]
    e = rule.make_push(x, [centre[0].clone()], grads=[torch.full((2,), 99.0)])  # grads are ignored
    assert torch.equal(e[0], torch.tensor([1.0, -1.0]))  # 0.25 * (x - centre)
    assert torch.equal(x[0], torch.tensor([3.0, -1.0]))
    rule.apply(centre, Push(0, 0, tuple(e)))
    assert torch.equal(centre[0], torch.tensor([1.0, 1.0]))


def test_deepspark_convex_combinations():
    rule = RULES.create("easgd-deepspark", alpha=0.25, server_factor=2.0)
    assert rule.locking is Locking.NONE and rule.server_alpha == 0.5
    x, centre = [torch.tensor([4.0, 0.0])], [torch.tensor([0.0, 8.0])]
    payload = rule.make_push(x, [centre[0].clone()], grads=[])
    assert torch.equal(payload[0], torch.tensor([4.0, 0.0]))  # full pre-move weights
    assert torch.equal(x[0], torch.tensor([3.0, 2.0]))  # 0.75 x + 0.25 centre_old
    rule.apply(centre, Push(0, 0, tuple(payload)))
    assert torch.equal(centre[0], torch.tensor([2.0, 4.0]))  # 0.5 centre + 0.5 x


def test_deepspark_defaults():
    rule = EASGD(variant="deepspark")
    assert rule.alpha == 0.1 and rule.server_alpha == 0.1 and rule.locking is Locking.NONE
    assert EASGD(variant="deepspark", locking="global").locking is Locking.GLOBAL
    assert EASGD(num_workers=4).locking is Locking.GLOBAL


def test_make_push_works_on_model_parameters_that_require_grad():
    model = torch.nn.Linear(2, 1)
    local = list(model.parameters())
    pulled = [torch.zeros_like(p) for p in local]
    e = EASGD(alpha=0.5).make_push(local, pulled, grads=[])
    assert all(not t.requires_grad for t in e)
    RULES.create("asgd").merge(local, pulled)  # the base merge must also work on parameters
    assert all(torch.equal(p.detach(), z) for p, z in zip(local, pulled, strict=True))


def test_easgd_needs_num_workers_or_alpha():
    with pytest.raises(ValueError, match="num_workers"):
        EASGD()
