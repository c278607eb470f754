"""ASGD / Hogwild / SA-ASGD against torch.optim and hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError
from sparkdp.rules import ASGD, RULES, Locking, Push

from ._ref import TwoWorkerSim, assert_same, one_worker, torch_reference

STEPS = 6


@pytest.mark.parametrize(
    ("rule_kwargs", "make_opt"),
    [
        ({"lr": 0.1}, lambda ps: torch.optim.SGD(ps, lr=0.1)),
        (
            {"lr": 0.1, "server_optimizer": "sgd", "server_optimizer_kwargs": {"momentum": 0.9}},
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        ),
        (
            {
                "lr": 0.05,
                "server_optimizer": "SGD",
                "server_optimizer_kwargs": {"momentum": 0.9, "nesterov": True},
            },
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
        ),
        ({"lr": 0.01, "server_optimizer": "adam"}, lambda ps: torch.optim.Adam(ps, lr=0.01)),
        ({"lr": 0.1, "server_optimizer": "adagrad"}, lambda ps: torch.optim.Adagrad(ps, lr=0.1)),
        (
            {"server_optimizer": lambda ps: torch.optim.SGD(ps, lr=0.1)},
            lambda ps: torch.optim.SGD(ps, lr=0.1),
        ),
    ],
    ids=["sgd-fast-path", "sgd-momentum", "sgd-nesterov", "adam", "adagrad", "factory"],
)
def test_one_worker_without_staleness_equals_torch_optimizer(rule_kwargs, make_opt):
    expected = torch_reference(make_opt, STEPS)
    assert_same(one_worker(ASGD(**rule_kwargs), STEPS), expected, "ASGD vs torch.optim")


def test_server_optimizer_updates_the_servers_tensors_in_place():
    center = [torch.zeros(3), torch.zeros(2)]
    ptrs = [c.data_ptr() for c in center]
    rule = ASGD(lr=1.0, server_optimizer="adam")
    rule.apply(center, Push(0, 0, (torch.ones(3), -torch.ones(2))))
    assert [c.data_ptr() for c in center] == ptrs
    assert torch.allclose(center[0], -torch.ones(3)) and torch.allclose(center[1], torch.ones(2))


def test_views_of_a_flat_buffer_are_updated_in_place():
    flat = torch.zeros(5)
    ASGD(lr=0.5, server_optimizer="sgd", server_optimizer_kwargs={"momentum": 0.5}).apply(
        [flat[:2], flat[2:]], Push(0, 0, (torch.ones(2), torch.full((3,), 2.0)))
    )
    assert torch.equal(flat, torch.tensor([-0.5, -0.5, -1.0, -1.0, -1.0]))


def test_new_centre_tensors_keep_the_optimizer_state():
    """If the server hands over different tensors, momentum must survive the re-wrap."""
    a = ASGD(lr=0.1, server_optimizer_kwargs={"momentum": 0.9})
    b = ASGD(lr=0.1, server_optimizer_kwargs={"momentum": 0.9})
    ca, cb = [torch.ones(2)], [torch.ones(2)]
    for step in range(4):
        g = (torch.tensor([1.0, -2.0]) * (step + 1),)
        a.apply(ca, Push(0, 0, g))
        b.apply(cb, Push(0, 0, g))
        cb = [cb[0].clone()]  # b's server copies its centre every time
    assert_same(cb, ca, "re-wrapped centre")


def test_hogwild_is_asgd_without_locks_and_equal_single_threaded():
    hog = RULES.create("hogwild", lr=0.1)
    assert isinstance(hog, ASGD) and hog.locking is Locking.NONE
    assert RULES.create("asgd").locking is Locking.GLOBAL
    a, h = ASGD(lr=0.1), RULES.create("hogwild", lr=0.1)
    sim_a, sim_h = TwoWorkerSim(a), TwoWorkerSim(h)
    sim_a.run(a, 8)
    sim_h.run(h, 8)
    assert_same(sim_h.center, sim_a.center, "hogwild vs asgd")


def test_hogwild_refuses_a_stateful_server_optimizer():
    with pytest.raises(ConfigError, match="locking='none'.*plain SGD"):
        RULES.create("hogwild", server_optimizer="adam")


@pytest.mark.parametrize(
    ("name", "tau", "scale"),
    [
        ("sa-asgd", 0, 1.0),
        ("sa-asgd", 1, 1.0),
        ("sa-asgd", 4, 0.25),
        ("ssgd-aware", 5, 0.2),
        ("dynsgd", 3, 0.25),
    ],
)
def test_staleness_scaled_step(name, tau, scale):
    center = [torch.tensor([1.0, -1.0])]
    g = torch.tensor([2.0, 4.0])
    RULES.create(name, lr=0.5).apply(center, Push(worker=1, staleness=tau, tensors=(g,)))
    assert torch.allclose(center[0], torch.tensor([1.0, -1.0]) - 0.5 * scale * g, rtol=0, atol=1e-7)


def test_staleness_scaling_through_a_server_optimizer_scales_the_gradient():
    center = [torch.tensor([0.0])]
    ASGD(lr=1.0, staleness_scaling="inverse", server_optimizer_kwargs={"momentum": 0.5}).apply(
        center, Push(0, 4, (torch.tensor([2.0]),))
    )
    assert center[0].item() == pytest.approx(-0.5)


def test_push_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="shape"):
        ASGD().apply([torch.zeros(3)], Push(0, 0, (torch.zeros(4),)))
    with pytest.raises(ValueError, match="1 tensors but this shard has 2"):
        ASGD().apply([torch.zeros(3), torch.zeros(1)], Push(0, 0, (torch.zeros(3),)))


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="staleness must be an integer >= 0"):
        RULES.create("sa-asgd").apply([torch.zeros(1)], Push(0, -1, (torch.zeros(1),)))
