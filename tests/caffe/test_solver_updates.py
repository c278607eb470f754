"""Caffe update rules against torch.optim equivalents and hand-written formulas (docs/algorithms.md §9)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from sparkdp.caffe.optim import CaffeAdaDelta, CaffeAdaGrad, CaffeAdam, CaffeNesterov, CaffeRMSProp, CaffeSGD
from sparkdp.caffe.solver import load_solver
from sparkdp.errors import ConfigError

TARGET = torch.tensor([0.5, -1.0, 2.0, 0.25])


def loss_fn(w):
    # A quadratic with different curvatures per coordinate.
    return (torch.tensor([1.0, 2.0, 0.5, 3.0]) * (w - TARGET) ** 2).sum()


def run(make_opt, steps=20, start=(1.0, 1.0, -1.0, 0.0)):
    w = torch.nn.Parameter(torch.tensor(start))
    opt = make_opt([w])
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(w).backward()
        opt.step()
    return w.detach()


@pytest.mark.parametrize(
    "caffe, reference",
    [
        (lambda p: CaffeSGD(p, lr=0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
        (
            lambda p: CaffeSGD(p, lr=0.05, momentum=0.9, weight_decay=0.1),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1),
        ),
        (
            lambda p: CaffeNesterov(p, lr=0.05, momentum=0.9),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        ),
        (lambda p: CaffeAdaGrad(p, lr=0.1, delta=1e-6), lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-6)),
        (
            lambda p: CaffeRMSProp(p, lr=0.01, rms_decay=0.98, delta=1e-6),
            lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.98, eps=1e-6),
        ),
        (
            lambda p: CaffeAdaDelta(p, lr=1.0, momentum=0.95, delta=1e-6),
            lambda p: torch.optim.Adadelta(p, lr=1.0, rho=0.95, eps=1e-6),
        ),
    ],
    ids=["sgd", "sgd-l2", "nesterov", "adagrad", "rmsprop", "adadelta"],
)
def test_equal_to_torch_at_constant_rate(caffe, reference):
    got, want = run(caffe), run(reference)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_sgd_differs_from_torch_after_rate_change_as_in_caffe_md():
    # docs/algorithms.md §9 (SGD): w0 = 1, loss = w^2, momentum 0.9,
    # 5 steps at lr 0.01 then 5 at 0.001 -> Caffe w = 0.4549, torch w = 0.7022.
    text = 'base_lr: 0.01 momentum: 0.9 lr_policy: "multistep" gamma: 0.1 stepvalue: 5'
    w = torch.nn.Parameter(torch.tensor([1.0]))
    solver = load_solver(text, [w])
    v = torch.nn.Parameter(torch.tensor([1.0]))
    ref = torch.optim.SGD([v], lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(ref, milestones=[5], gamma=0.1)
    for _ in range(10):
        solver.zero_grad()
        (w**2).sum().backward()
        solver.step()
        ref.zero_grad()
        (v**2).sum().backward()
        ref.step()
        sched.step()
    assert w.item() == pytest.approx(0.4549, abs=1e-4)
    assert v.item() == pytest.approx(0.7022, abs=1e-4)
    # Hand check of the Caffe rule in double precision.
    x, hist = 1.0, 0.0
    for lr in [0.01] * 5 + [0.001] * 5:
        hist = 0.9 * hist + lr * 2 * x
        x -= hist
    assert w.item() == pytest.approx(x, rel=1e-5)


def adam_reference(grads, lr, b1, b2, eps, w0):
    """Caffe's Adam (docs/algorithms.md §9) written out in float64.

    Hyperparameters are proto ``float`` fields in Caffe, hence rounded to float32.
    """
    b1, b2, eps, lr = (float(np.float32(x)) for x in (b1, b2, eps, lr))
    w, m, v = np.array(w0, dtype=np.float64), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


def test_adam_matches_caffe_formula_and_differs_from_torch_for_tiny_grads():
    grads = [np.array([1e-9, -2e-9, 3e-9]) * (k + 1) for k in range(5)]
    w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    v = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    caffe = CaffeAdam([w], lr=0.001, momentum=0.9, momentum2=0.999, delta=1e-8)
    ref = torch.optim.Adam([v], lr=0.001, betas=(0.9, 0.999), eps=1e-8)
    for g in grads:
        w.grad = torch.tensor(g)
        v.grad = torch.tensor(g)
        caffe.step()
        ref.step()
    want = adam_reference(grads, 0.001, 0.9, 0.999, 1e-8, np.zeros(3))
    np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-6)
    # eps not bias-corrected: clearly different from torch when |g| ~ eps.
    assert not torch.allclose(w, v, rtol=1e-2)


def test_adam_from_solver_file():
    text = 'type: "Adam" base_lr: 0.01 momentum: 0.9 momentum2: 0.99 delta: 1e-4 lr_policy: "fixed"'
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float64))
    solver = load_solver(text, [w])
    grads = [np.array([0.5, 0.25]), np.array([-0.1, 0.3]), np.array([0.2, 0.2])]
    for g in grads:
        w.grad = torch.tensor(g)
        solver.step()
    want = adam_reference(grads, 0.01, 0.9, 0.99, 1e-4, [1.0, -1.0])
    np.testing.assert_allclose(w.detach().numpy(), want, rtol=1e-6)


def test_l1_and_l2_decay_with_decay_mult_and_lr_mult():
    a = torch.nn.Parameter(torch.tensor([2.0, -3.0, 0.0]))
    b = torch.nn.Parameter(torch.tensor([2.0, -3.0, 0.0]))
    c = torch.nn.Parameter(torch.tensor([2.0, -3.0, 0.0]))
    groups = [
        {"params": [a]},
        {"params": [b], "decay_mult": 0.0, "lr_mult": 2.0},
        {"params": [c], "lr_mult": 0.5},
    ]
    solver = load_solver(
        'base_lr: 1.0 weight_decay: 0.1 regularization_type: "L1" lr_policy: "fixed"', groups
    )
    for p in (a, b, c):
        p.grad = torch.tensor([1.0, 1.0, 1.0])
    solver.step()
    # L1: w - lr*lr_mult*(g + wd*decay_mult*sign(w)); sign(0) = 0.
    torch.testing.assert_close(a.detach(), torch.tensor([2 - 1.1, -3 - 0.9, -1.0]))
    torch.testing.assert_close(b.detach(), torch.tensor([0.0, -5.0, -2.0]))
    torch.testing.assert_close(c.detach(), torch.tensor([2 - 0.55, -3 - 0.45, -0.5]))
    d = torch.nn.Parameter(torch.tensor([2.0, -3.0]))
    l2 = load_solver(
        'base_lr: 0.5 weight_decay: 0.1 lr_policy: "fixed"', [{"params": [d], "decay_mult": 2.0}]
    )
    d.grad = torch.zeros(2)
    l2.step()
    torch.testing.assert_close(d.detach(), torch.tensor([2 - 0.5 * 0.2 * 2, -3 + 0.5 * 0.2 * 3]))


def test_clip_acts_on_global_norm_before_decay():
    w = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    u = torch.nn.Parameter(torch.tensor([0.0]))
    solver = load_solver('base_lr: 1.0 weight_decay: 0.5 clip_gradients: 1.0 lr_policy: "fixed"', [w, u])
    w.grad, u.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # global norm 5 -> scale 0.2
    solver.step()
    torch.testing.assert_close(w.detach(), torch.tensor([1 - 0.6 - 0.5, 1 - 0.0 - 0.5]))
    torch.testing.assert_close(u.detach(), torch.tensor([-0.8]))
    # Below the threshold nothing is scaled.
    solver2 = load_solver('base_lr: 1.0 clip_gradients: 10 lr_policy: "fixed"', [w])
    before = w.detach().clone()
    w.grad = torch.tensor([3.0, 4.0])
    solver2.step()
    torch.testing.assert_close(w.detach(), before - torch.tensor([3.0, 4.0]))


def test_iter_size_normalises_after_clipping_the_sum():
    w = torch.nn.Parameter(torch.zeros(2))
    solver = load_solver('base_lr: 1.0 iter_size: 2 clip_gradients: 5 lr_policy: "fixed"', [w])
    solver.zero_grad()
    for _ in range(2):  # two accumulated passes: sum = [6, 8], norm 10 -> clipped to [3, 4]
        (w * torch.tensor([3.0, 4.0])).sum().backward()
    solver.step()
    # clip first, then divide by iter_size: [1.5, 2]; the other order would give [3, 4].
    torch.testing.assert_close(w.detach(), torch.tensor([-1.5, -2.0]))


def test_iter_size_equals_mean_gradient_of_a_bigger_batch():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8)
    w1 = torch.nn.Parameter(torch.zeros(3))
    w2 = torch.nn.Parameter(torch.zeros(3))
    s1 = load_solver('base_lr: 0.1 momentum: 0.9 iter_size: 2 lr_policy: "fixed"', [w1])
    s2 = load_solver('base_lr: 0.1 momentum: 0.9 lr_policy: "fixed"', [w2])
    for _ in range(3):
        s1.zero_grad()
        for half in (slice(0, 4), slice(4, 8)):
            ((x[half] @ w1 - y[half]) ** 2).mean().backward()
        s1.step()
        s2.zero_grad()
        ((x @ w2 - y) ** 2).mean().backward()
        s2.step()
    torch.testing.assert_close(w1.detach(), w2.detach())


def test_param_without_grad_keeps_momentum_and_frozen_param_is_skipped():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    frozen = torch.nn.Parameter(torch.tensor([1.0]), requires_grad=False)
    solver = load_solver('base_lr: 1.0 momentum: 0.5 lr_policy: "fixed"', [w, frozen])
    w.grad = torch.tensor([1.0])
    solver.step()  # v = 1, w = 0
    solver.zero_grad()  # grad None: Caffe still updates with a zero diff
    solver.step()  # v = 0.5, w = -0.5
    assert w.item() == pytest.approx(-0.5) and frozen.item() == 1.0


def test_net_param_groups_are_used_with_the_solver_rate():
    class FakeNet(torch.nn.Module):
        caffe_layers = [("ip", "InnerProduct")]

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))
            self.b = torch.nn.Parameter(torch.ones(2))

        def blobs_of(self, name):
            return [self.w, self.b]

        def param_groups(self, base_lr, weight_decay):
            # lr/weight_decay may come pre-multiplied; the solver must not multiply twice.
            return [
                {
                    "params": [self.w],
                    "lr": base_lr,
                    "weight_decay": weight_decay,
                    "lr_mult": 1.0,
                    "decay_mult": 1.0,
                },
                {
                    "params": [self.b],
                    "lr": 2 * base_lr,
                    "weight_decay": 0.0,
                    "lr_mult": 2.0,
                    "decay_mult": 0.0,
                },
            ]

    net = FakeNet()
    solver = load_solver('base_lr: 0.1 weight_decay: 0.5 lr_policy: "fixed"', net)
    net.w.grad, net.b.grad = torch.ones(2), torch.ones(2)
    solver.step()
    torch.testing.assert_close(net.w.detach(), torch.full((2,), 1 - 0.1 * 1.5))
    torch.testing.assert_close(net.b.detach(), torch.full((2,), 1 - 0.2))


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
def test_state_dict_resume_is_exact(kind):
    momentum = "" if kind in ("AdaGrad", "RMSProp") else "momentum: 0.9"
    text = (
        f'type: "{kind}" base_lr: 0.05 {momentum} lr_policy: "multistep" gamma: 0.5 stepvalue: 2 stepvalue: 4'
    )

    def steps(solver, w, n):
        for _ in range(n):
            solver.zero_grad()
            loss_fn(w).backward()
            solver.step()

    w = torch.nn.Parameter(torch.tensor([1.0, 1.0, -1.0, 0.0]))
    solver = load_solver(text, [w])
    steps(solver, w, 3)
    state = copy.deepcopy(solver.state_dict())
    assert state["iter"] == 3 and state["current_step"] == 1
    assert len(state["history"]) == (2 if kind in ("AdaDelta", "Adam") else 1)
    w2 = torch.nn.Parameter(w.detach().clone())
    resumed = load_solver(text, [w2])
    resumed.load_state_dict(state)
    assert resumed.rate == solver.rate
    steps(solver, w, 4)
    steps(resumed, w2, 4)
    torch.testing.assert_close(w2.detach(), w.detach(), rtol=0, atol=0)
    other = load_solver(
        'type: "Nesterov" base_lr: 0.1 lr_policy: "fixed"'
        if kind != "Nesterov"
        else 'base_lr: 0.1 lr_policy: "fixed"',
        [w2],
    )
    with pytest.raises(ConfigError, match="solver state was saved by"):
        other.load_state_dict(state)


def test_optimizer_argument_checks():
    w = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ConfigError, match="regularization"):
        CaffeSGD(w, lr=0.1, regularization="L3")
    with pytest.raises(ConfigError, match=r"rms_decay must be in \[0.0, 1.0\)"):
        CaffeRMSProp(w, lr=0.1, rms_decay=1.0)
    with pytest.raises(ConfigError, match="lr must be >= 0"):
        CaffeAdam(w, lr=-1.0)
