"""DDC-ASGD (docs/algorithms.md §7): its reductions and each of its pieces."""

from __future__ import annotations

import math

import pytest
import torch

from sparkdp.rules import DCASGD, DDCASGD, RULES, Push, delay_cap, delay_compensation, momentum_for_delay

from ._ref import TwoWorkerSim, assert_same, one_worker, torch_reference


def test_one_worker_is_torch_sgd_with_heavy_ball_momentum():
    expected = torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0), 8)
    assert_same(one_worker(DDCASGD(lr=0.05, num_workers=1), 8), expected, "DDC-ASGD(M=1) vs torch SGD")


@pytest.mark.parametrize(
    ("tau", "mu"), [(0, 0.9), (1, 8 / 9), (3, 6 / 7), (7, 2 / 3), (8, 0.5), (9, 0.0), (10, 0.0), (100, 0.0)]
)
def test_lag_budget(tau, mu):
    assert momentum_for_delay(tau, 0.9) == pytest.approx(mu, abs=1e-12)


def test_lag_budget_exact_points():
    assert momentum_for_delay(0, 0.9) == 0.9  # bit-exact, so M = 1 is torch SGD
    assert momentum_for_delay(9, 0.9) == 0.0
    assert momentum_for_delay(3, 0.9) == pytest.approx(0.857142857)
    assert momentum_for_delay(7, 0.9) == pytest.approx(0.666666667)
    assert momentum_for_delay(20, 0.9, lag_min=1.0) == 0.5


def test_delay_cap():
    assert [delay_cap(t, 4) for t in (0, 1, 4, 8, 16)] == [1.0, 1.0, 1.0, 0.5, 0.25]
    assert delay_cap(1000, math.inf) == 1.0


def test_clip_never_flips_the_sign_of_g():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        g = torch.randn(1000, generator=gen)
        displacement = torch.randn(1000, generator=gen) * 100
        strength = torch.rand(1000, generator=gen) * 1e4
        c = delay_compensation(g, displacement, strength, kappa=1.0)
        g_hat = g + c
        assert bool((g_hat * g >= 0).all()), "a coordinate of g changed sign"
        assert bool((g_hat.abs() <= 2 * g.abs() + 1e-6).all())
    unclipped = delay_compensation(torch.tensor([1.0]), torch.tensor([-5.0]), 1.0, kappa=math.inf)
    assert unclipped.item() == -5.0  # DC-ASGD's own correction can flip it


def test_clip_hand_numbers():
    g = torch.tensor([2.0, -1.0, 0.5])
    c = delay_compensation(g, torch.tensor([1.0, 1.0, 0.0]), 1.0, kappa=1.0)
    # raw 4, 1, 0 -> clipped to +-|g|: 2, 1, 0
    assert c.tolist() == [2.0, 1.0, 0.0]


def test_reduces_to_dcasgd_a():
    """momentum 0, tau_c = kappa = inf, per-worker V: exactly DC-ASGD-a, stale pushes included."""
    ddc = DDCASGD(lr=0.1, momentum=0.0, tau_c=math.inf, kappa=math.inf, per_worker_mean_square=True)
    dc = DCASGD(lr=0.1, variant="a")
    sim_ddc, sim_dc = TwoWorkerSim(ddc), TwoWorkerSim(dc)
    sim_ddc.run(ddc, 9)
    sim_dc.run(dc, 9)
    assert_same(sim_ddc.center, sim_dc.center, "DDC-ASGD reduction vs DC-ASGD-a")


def test_stale_update_hand_numbers():
    """tau = 8 with tau_c = 2: lambda scaled by 1/4, correction clipped, mu = 0.5."""
    rule = DDCASGD(lr=0.1, num_workers=2)
    rule.on_pull(0, [torch.tensor([0.0, 0.0])])
    w = [torch.tensor([1.0, 1.0])]
    g = torch.tensor([1.0, 0.1])
    rule.apply(w, Push(worker=0, staleness=8, tensors=(g,)))
    v = [0.05 * 1.0, 0.05 * 0.01]
    raw = [0.5 / math.sqrt(v[0] + 1e-7) * 1.0 * 1.0, 0.5 / math.sqrt(v[1] + 1e-7) * 0.01 * 1.0]
    c = [min(raw[0], 1.0), min(raw[1], 0.1)]  # both capped at kappa * |g|
    assert c == [1.0, 0.1]
    u = [1.0 + c[0], 0.1 + c[1]]  # first buffer = g_hat
    assert w[0].tolist() == pytest.approx([1 - 0.1 * u[0], 1 - 0.1 * u[1]], abs=1e-7)
    # second push, tau = 8: u <- 0.5 u + g_hat (backup refreshed: no correction)
    rule.on_pull(0, w)
    before = w[0].clone()
    rule.apply(w, Push(worker=0, staleness=8, tensors=(g,)))
    expected = before - 0.1 * (0.5 * torch.tensor(u) + g)
    assert torch.allclose(w[0], expected, atol=1e-7)


def test_defaults_follow_the_spec():
    rule = RULES.create("ddcasgd", num_workers=8)
    assert (
        rule.momentum,
        rule.lag_min,
        rule.lambda_,
        rule.mean_square_decay,
        rule.eps,
        rule.tau_c,
        rule.kappa,
    ) == (
        0.9,
        0.0,
        2.0,
        0.95,
        1e-7,
        8.0,
        1.0,
    )
    with pytest.raises(ValueError, match="num_workers"):
        DDCASGD()


def test_many_stale_workers_stay_finite():
    rule = DDCASGD(lr=0.05, num_workers=2)
    sim = TwoWorkerSim(rule)
    sim.run(rule, 40)
    assert all(bool(torch.isfinite(c).all()) for c in sim.center)
