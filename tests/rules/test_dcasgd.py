"""DC-ASGD (Zheng et al. 2017) against ASGD, torch.optim and hand-worked 2-element numbers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from sparkdp.rules import ASGD, DCASGD, RULES, Push

from ._ref import TwoWorkerSim, assert_same, one_worker, torch_reference


@pytest.mark.parametrize("variant", ["a", "c"])
def test_lambda_zero_warns_and_equals_asgd_with_stale_pushes(variant):
    with pytest.warns(UserWarning, match="equivalent to ASGD"):
        dc = DCASGD(lr=0.1, variant=variant, lambda_=0)
    asgd = ASGD(lr=0.1)
    sim_dc, sim_a = TwoWorkerSim(dc), TwoWorkerSim(asgd)
    sim_dc.run(dc, 9)
    sim_a.run(asgd, 9)
    assert sim_dc.pulled_version == [9, 8]  # the pushes really were stale
    assert_same(sim_dc.center, sim_a.center, "DC-ASGD(lambda=0) vs ASGD")


@pytest.mark.parametrize("variant", ["a", "c"])
@pytest.mark.parametrize("lam", [0.04, 2.0, 100.0])
def test_centre_equal_to_backup_equals_asgd_for_any_lambda(variant, lam):
    expected = torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.1), 6)
    assert_same(one_worker(DCASGD(lr=0.1, variant=variant, lambda_=lam), 6), expected, "DC-ASGD, no delay")


def test_momentum_without_delay_is_torch_heavy_ball():
    expected = torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), 7)
    assert_same(one_worker(DCASGD(lr=0.05, momentum=0.9), 7), expected, "DC-ASGD momentum vs torch SGD")


def _stale_push(rule):
    """w = [1, 2] but the worker computed g = [2, -1] at its backup [0.5, 2.5]."""
    rule.on_pull(0, [torch.tensor([0.5, 2.5])])
    w = [torch.tensor([1.0, 2.0])]
    rule.apply(w, Push(worker=0, staleness=2, tensors=(torch.tensor([2.0, -1.0]),)))
    return w[0]


def test_dcasgd_c_hand_numbers():
    # d = g + 0.04 * g^2 * (w - bak) = [2 + 0.04*4*0.5, -1 + 0.04*1*(-0.5)] = [2.08, -1.02]
    got = _stale_push(DCASGD(lr=0.1, variant="c", lambda_=0.04))
    assert got.tolist() == pytest.approx([1 - 0.1 * 2.08, 2 + 0.1 * 1.02], abs=1e-6)
    assert got.tolist() == pytest.approx([0.792, 2.102], abs=1e-6)


def test_dcasgd_a_hand_numbers():
    # MeanSquare starts at 0: ms = 0.05 * g^2 = [0.2, 0.05]; lambda_t = 2 / sqrt(ms + 1e-7)
    lam = [2 / math.sqrt(0.2 + 1e-7), 2 / math.sqrt(0.05 + 1e-7)]
    d = [2 + lam[0] * 4 * 0.5, -1 + lam[1] * 1 * (-0.5)]
    got = _stale_push(DCASGD(lr=0.1, variant="a"))
    assert got.tolist() == pytest.approx([1 - 0.1 * d[0], 2 - 0.1 * d[1]], abs=1e-6)
    assert got.tolist() == pytest.approx([-0.0944250, 2.5472131], abs=1e-5)


def test_mean_square_and_backup_are_per_worker():
    rule = DCASGD(lr=0.1, variant="a")
    rule.on_pull(1, [torch.tensor([0.0, 0.0])])
    rule.apply([torch.tensor([0.0, 0.0])], Push(1, 0, (torch.tensor([10.0, 10.0]),)))  # worker 1's ms grows
    assert _stale_push(rule).tolist() == pytest.approx(
        [-0.0944250, 2.5472131], abs=1e-5
    )  # worker 0 unaffected


def test_push_without_a_pull_is_not_compensated():
    w = [torch.tensor([1.0, 2.0])]
    DCASGD(lr=0.1, variant="c", lambda_=1.0).apply(w, Push(worker=3, staleness=5, tensors=(torch.ones(2),)))
    assert torch.allclose(w[0], torch.tensor([0.9, 1.9]))


def test_on_pull_stores_a_copy():
    rule = DCASGD(lr=0.1, variant="c", lambda_=1.0)
    centre = [torch.tensor([1.0])]
    rule.on_pull(0, centre)
    centre[0].add_(1.0)  # the server moves on; the backup must not follow
    assert rule.state_dict()["backup"][0][0].item() == 1.0


@pytest.mark.parametrize(
    ("name", "variant", "lam"), [("dcasgd", "a", 2.0), ("dcasgd-a", "a", 2.0), ("dcasgd-c", "c", 0.04)]
)
def test_registry_presets(name, variant, lam):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rule = RULES.create(name)
    assert (rule.variant, rule.lambda_, rule.mean_square_decay, rule.eps, rule.momentum) == (
        variant,
        lam,
        0.95,
        1e-7,
        0.0,
    )
