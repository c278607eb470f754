"""Caffe learning-rate policies against the formulas of docs/algorithms.md §9, computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sparkdp.caffe.lr_policy import (
    CaffeLRScheduler,
    learning_rate,
    lr_lambda,
    multistep_current_step,
)
from sparkdp.caffe.optim import CaffeSGD
from sparkdp.caffe.solver import SolverSpec
from sparkdp.errors import ConfigError


def spec(**kw):
    return SolverSpec(**{"base_lr": 0.01, **kw})


CASES = [
    # (policy settings, iteration, expected value from the formula in double precision)
    (dict(lr_policy="fixed"), 0, 0.01),
    (dict(lr_policy="fixed"), 12345, 0.01),
    (dict(lr_policy="step", gamma=0.1, stepsize=100), 99, 0.01),
    (dict(lr_policy="step", gamma=0.1, stepsize=100), 100, 0.001),
    (dict(lr_policy="step", gamma=0.1, stepsize=100), 250, 0.01 * 0.1**2),
    (dict(lr_policy="exp", gamma=0.99), 10, 0.01 * 0.99**10),
    (dict(lr_policy="inv", gamma=1e-4, power=0.75), 0, 0.01),
    (dict(lr_policy="inv", gamma=1e-4, power=0.75), 1000, 0.01 * (1 + 1e-4 * 1000) ** -0.75),
    (dict(lr_policy="multistep", gamma=0.5, stepvalue=(5, 8)), 4, 0.01),
    (dict(lr_policy="multistep", gamma=0.5, stepvalue=(5, 8)), 5, 0.005),
    (dict(lr_policy="multistep", gamma=0.5, stepvalue=(5, 8)), 100, 0.0025),
    (dict(lr_policy="poly", power=2.0, max_iter=100), 25, 0.01 * (1 - 0.25) ** 2),
    (dict(lr_policy="poly", power=2.0, max_iter=100), 100, 0.0),
    (dict(lr_policy="sigmoid", gamma=-0.01, stepsize=300), 300, 0.005),
    (dict(lr_policy="sigmoid", gamma=-0.01, stepsize=300), 500, 0.01 / (1 + math.exp(0.01 * 200))),
]


@pytest.mark.parametrize("settings, it, expected", CASES)
def test_policy_matches_formula(settings, it, expected):
    got = learning_rate(spec(**settings), it)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-12), (settings, it, got, expected)
    assert got == float(np.float32(got)), "Caffe computes the rate in float32"


def test_lenet_inv_value_from_caffe_md():
    s = spec(lr_policy="inv", gamma=1e-4, power=0.75)
    assert abs(learning_rate(s, 5000) - 0.0073778795) < 1e-9


def test_multistep_advances_at_most_once_per_iteration():
    # Repeated step values: Caffe's current_step increments once per call, so the
    # second decay happens one iteration later.
    s = spec(lr_policy="multistep", gamma=0.1, stepvalue=(3, 3, 3))
    assert [multistep_current_step(s.stepvalue, it) for it in range(7)] == [0, 0, 0, 1, 2, 3, 3]
    assert learning_rate(s, 4) == pytest.approx(1e-4, rel=1e-6)


def test_scheduler_tracks_multistep_statefully_like_closed_form():
    s = spec(lr_policy="multistep", gamma=0.1, stepvalue=(2, 2, 5))
    w = torch.nn.Parameter(torch.zeros(1))
    opt = CaffeSGD([w], lr=s.base_lr)
    sched = CaffeLRScheduler(opt, s)
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [learning_rate(s, it) for it in range(8)]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="allowed: fixed, step, exp, inv, multistep, poly, sigmoid"):
        spec(lr_policy="cosine")
    with pytest.raises(ConfigError, match="no lr_policy"):
        SolverSpec(base_lr=0.1)


def test_scheduler_drives_a_plain_torch_optimizer_with_lr_mult():
    s = spec(lr_policy="step", gamma=0.1, stepsize=2)
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr_mult": 2.0}], lr=0.01)
    sched = CaffeLRScheduler(opt, s)
    lrs = []
    for _ in range(3):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    expected = [[0.01, 0.02], [0.01, 0.02], [0.001, 0.002]]
    for got, want in zip(lrs, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-6)


def test_lambda_factor_for_lambdalr():
    s = spec(lr_policy="exp", gamma=0.5)
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(s))
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**3, rel=1e-6)
    with pytest.raises(ConfigError, match="base_lr"):
        lr_lambda(SolverSpec(base_lr=0.0, lr_policy="fixed"))
