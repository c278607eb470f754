"""Shared references for the rule tests: a tiny least-squares problem and drivers.

Gradients are computed by autograd on a detached copy, so the rule under test and the
``torch.optim`` reference see bit-identical gradients whenever their parameters agree.
"""

from __future__ import annotations

import copy

import torch

from sparkdp.rules import Push, UpdateRule, pseudo_gradient


def problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 3, generator=g)
    y = torch.randn(32, 2, generator=g)
    init = [torch.randn(2, 3, generator=g), torch.randn(2, generator=g)]
    return x, y, init


def grads_at(params, x, y, step: int) -> list[torch.Tensor]:
    """Mini-batch ``step`` (8 rows, cycling) gradient of the MSE at ``params``."""
    rows = slice(8 * (step % 4), 8 * (step % 4) + 8)
    ps = [p.detach().clone().requires_grad_(True) for p in params]
    loss = ((x[rows] @ ps[0].T + ps[1] - y[rows]) ** 2).mean()
    return list(torch.autograd.grad(loss, ps))


def torch_reference(make_opt, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Single-machine training with a ``torch.optim`` optimizer built by ``make_opt(params)``."""
    x, y, init = problem(seed)
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = make_opt(params)
    for t in range(steps):
        for p, g in zip(params, grads_at(params, x, y, t), strict=True):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def one_worker(rule: UpdateRule, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """One worker, staleness 0: pull, gradient at the centre, push, repeat."""
    x, y, init = problem(seed)
    center = [t.clone() for t in init]
    for t in range(steps):
        rule.on_pull(0, center)
        rule.apply(center, Push(worker=0, staleness=0, tensors=tuple(grads_at(center, x, y, t))))
    return center


class TwoWorkerSim:
    """Deterministic asynchronous run: workers alternate, each pushing after one local SGD step.

    Every push goes through the rule's worker hooks (make_push, merge) and server hooks
    (apply, on_pull) with the exact staleness, so EASGD and the ASGD family share it.
    """

    worker_lr = 0.05

    def __init__(self, rule: UpdateRule, seed: int = 0, *, initial_pull: bool = True) -> None:
        self.x, self.y, init = problem(seed)
        self.center = [t.clone() for t in init]
        self.version = 0
        self.local = [[t.clone() for t in init] for _ in range(2)]
        self.pulled = [[t.clone() for t in init] for _ in range(2)]
        self.pulled_version = [0, 0]
        self.t = 0
        for w in range(2 if initial_pull else 0):  # not when resuming: it would overwrite restored backups
            rule.on_pull(w, self.center)

    def snapshot(self) -> dict:
        return copy.deepcopy({k: v for k, v in vars(self).items()})

    def restore(self, snap: dict) -> None:
        vars(self).update(copy.deepcopy(snap))

    def run(self, rule: UpdateRule, steps: int) -> None:
        for _ in range(steps):
            w = self.t % 2
            local = self.local[w]
            for p, g in zip(local, grads_at(local, self.x, self.y, self.t), strict=True):
                p.sub_(g, alpha=self.worker_lr)
            grads = pseudo_gradient(self.pulled[w], local, self.worker_lr, 1)
            payload = rule.make_push(local, self.pulled[w], grads)
            tau = self.version - self.pulled_version[w]
            rule.apply(self.center, Push(worker=w, staleness=tau, tensors=tuple(payload)))
            self.version += 1
            rule.on_pull(w, self.center)
            self.pulled[w] = [c.clone() for c in self.center]
            self.pulled_version[w] = self.version
            rule.merge(local, self.pulled[w])
            self.t += 1


def assert_same(actual, expected, what: str = "") -> None:
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert torch.equal(a, e), f"{what} tensor {i}: got {a}, expected {e} (max diff {(a - e).abs().max()})"
