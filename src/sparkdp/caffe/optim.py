"""Caffe's update rules as ``torch.optim.Optimizer`` subclasses (``src/caffe/solvers/*.cpp``).

Each optimizer does Caffe's *Regularize* and *ComputeUpdateValue* followed by
``w -= update``; gradient clipping and ``iter_size`` normalisation happen before,
in :class:`sparkdp.caffe.solver.CaffeSolver`.  Differences from ``torch.optim``
that these classes exist for:

* SGD's history includes the rate and Adam's epsilon is not bias-corrected
  (docs/algorithms.md §9).
* Per-group ``lr_mult`` and ``decay_mult`` (default 1) multiply the group's ``lr``
  and ``weight_decay``, as Caffe's ParamSpec does; ``regularization`` is "L2" or
  "L1" (``weight_decay * decay_mult * sign(w)``).
* A learnable parameter (``requires_grad``) whose ``grad`` is None is updated
  with a zero gradient, because Caffe updates every learnable blob every
  iteration (momentum and weight decay keep acting on it).

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = CaffeSGD([w], lr=0.1, momentum=0.9)
    >>> w.grad = torch.ones(2); opt.step(); w.tolist()
    [0.8999999761581421, 0.8999999761581421]
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.optim import Optimizer

from ..errors import ConfigError

REGULARIZATION_TYPES = ("L2", "L1")

_f32 = np.float32


def _check_range(name: str, value: float, low: float, high: float, fix: str) -> None:
    if not (low <= value < high):
        raise ConfigError(f"{name} must be in [{low}, {high}); received {name}: {value}. {fix}")


class CaffeOptimizer(Optimizer):
    """Base class: regularisation, multipliers and state handling.

    Subclasses set :attr:`slots` (names of the per-parameter history tensors, in
    Caffe's ``history_`` order) and implement :meth:`_update`.
    """

    slots: tuple[str, ...] = ("history",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        *,
        weight_decay: float = 0.0,
        regularization: str = "L2",
        **hyper: float,
    ) -> None:
        if lr < 0:
            raise ConfigError(f"lr must be >= 0; received lr: {lr}.")
        if regularization not in REGULARIZATION_TYPES:
            raise ConfigError(
                f"unknown regularization {regularization!r}; allowed: "
                f"{', '.join(REGULARIZATION_TYPES)} (Caffe's regularization_type)."
            )
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            regularization=regularization,
            lr_mult=1.0,
            decay_mult=1.0,
            **hyper,
        )
        super().__init__(params, defaults)

    def _update(self, g: Tensor, state: dict[str, Any], rate: float, group: dict[str, Any]) -> Tensor:
        """Return the value subtracted from the parameter (Caffe's final diff)."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Regularize, compute Caffe's update value and apply ``w -= update``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # Caffe multiplies in float: local_rate = rate * lr_mult.
            rate = float(_f32(group["lr"]) * _f32(group["lr_mult"]))
            decay = float(_f32(group["weight_decay"]) * _f32(group["decay_mult"]))
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                if p.grad is not None and p.grad.is_sparse:
                    raise ConfigError("Caffe optimizers do not support sparse gradients.")
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                if decay != 0.0:
                    reg = p if group["regularization"] == "L2" else torch.sign(p)
                    g = g.add(reg, alpha=decay)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    for name in self.slots:
                        state[name] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                p.sub_(self._update(g, state, rate, group))
        return loss

    def learnable(self) -> list[Tensor]:
        """Parameters that get updates (``requires_grad``), in group order (Caffe's learnable_params)."""
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def history(self) -> list[Tensor]:
        """History tensors in Caffe's ``SolverState.history`` order.

        All parameters' first slot, then (AdaDelta, Adam) all parameters' second.
        A parameter never stepped contributes zeros.
        """
        out = []
        for name in self.slots:
            for p in self.learnable():
                st = self.state.get(p)
                out.append(st[name].detach().clone() if st else torch.zeros_like(p))
        return out

    def load_history(self, history: list[Tensor], iteration: int) -> None:
        """Restore :meth:`history` output; ``iteration`` = updates done so far."""
        params = self.learnable()
        want = len(params) * len(self.slots)
        if len(history) != want:
            raise ConfigError(
                f"history has {len(history)} tensors; this {type(self).__name__} over "
                f"{len(params)} parameters needs {want}. Was it saved with another solver type or net?"
            )
        for k, name in enumerate(self.slots):
            for i, p in enumerate(params):
                h = history[k * len(params) + i]
                if h.numel() != p.numel():
                    raise ConfigError(
                        f"history[{k * len(params) + i}] has {h.numel()} values; parameter {i} has "
                        f"{p.numel()} (shape {tuple(p.shape)})."
                    )
                st = self.state[p]
                st[name] = h.detach().reshape(p.shape).to(p).clone()
                st["step"] = int(iteration)
        for p in params:  # slots of a solver type whose history is absent stay zero
            for name in self.slots:
                self.state[p].setdefault(name, torch.zeros_like(p))


class CaffeSGD(CaffeOptimizer):
    """``v <- momentum*v + lr*g; w <- w - v`` (Caffe ``SGDSolver``)."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, **kw: Any) -> None:
        _check_range("momentum", momentum, 0.0, math.inf, "Typical value: 0.9.")
        super().__init__(params, lr, momentum=momentum, **kw)

    def _update(self, g, state, rate, group):
        h = state["history"]
        h.mul_(group["momentum"]).add_(g, alpha=rate)
        return h


class CaffeNesterov(CaffeSGD):
    """``v' = m*v + lr*g; update = (1+m)*v' - m*v`` (Caffe ``NesterovSolver``; arguments as :class:`CaffeSGD`)."""

    def _update(self, g, state, rate, group):
        m = group["momentum"]
        h = state["history"]
        prev = h.clone()
        h.mul_(m).add_(g, alpha=rate)
        return h.mul(1.0 + m).sub_(prev, alpha=m)


class CaffeAdaGrad(CaffeOptimizer):
    """``h += g^2; update = lr*g/(sqrt(h)+delta)`` (Caffe ``AdaGradSolver``)."""

    def __init__(self, params: Iterable[Any], lr: float, delta: float = 1e-8, **kw: Any) -> None:
        super().__init__(params, lr, delta=delta, **kw)

    def _update(self, g, state, rate, group):
        h = state["history"]
        h.addcmul_(g, g)
        return g.div(h.sqrt().add_(group["delta"])).mul_(rate)


class CaffeRMSProp(CaffeOptimizer):
    """``h = d*h + (1-d)*g^2; update = lr*g/(sqrt(h)+delta)`` (Caffe ``RMSPropSolver``)."""

    def __init__(
        self, params: Iterable[Any], lr: float, rms_decay: float = 0.99, delta: float = 1e-8, **kw: Any
    ) -> None:
        _check_range("rms_decay", rms_decay, 0.0, 1.0, "Typical value: 0.98.")
        super().__init__(params, lr, rms_decay=rms_decay, delta=delta, **kw)

    def _update(self, g, state, rate, group):
        d = group["rms_decay"]
        h = state["history"]
        h.mul_(d).addcmul_(g, g, value=float(_f32(1) - _f32(d)))
        return g.div(h.sqrt().add_(group["delta"])).mul_(rate)


class CaffeAdaDelta(CaffeOptimizer):
    """Zeiler's AdaDelta with ``momentum`` as rho, scaled by lr (Caffe ``AdaDeltaSolver``)."""

    slots = ("history", "update_history")

    def __init__(
        self, params: Iterable[Any], lr: float, momentum: float = 0.95, delta: float = 1e-8, **kw: Any
    ) -> None:
        _check_range("momentum (AdaDelta rho)", momentum, 0.0, 1.0, "Typical value: 0.95.")
        super().__init__(params, lr, momentum=momentum, delta=delta, **kw)

    def _update(self, g, state, rate, group):
        rho, delta = group["momentum"], group["delta"]
        one_minus = float(_f32(1) - _f32(rho))
        hg, hu = state["history"], state["update_history"]
        hg.mul_(rho).addcmul_(g, g, value=one_minus)
        u = g.mul(hu.add(delta).div_(hg.add(delta)).sqrt_())
        hu.mul_(rho).addcmul_(u, u, value=one_minus)
        return u.mul_(rate)


class CaffeAdam(CaffeOptimizer):
    """Adam with Caffe's un-corrected epsilon (Caffe ``AdamSolver``).

    ``update = lr * sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+delta)``, t = iteration + 1.
    ``torch.optim.Adam`` effectively uses ``delta*sqrt(1-b2^t)`` instead, which
    matters when gradients are tiny.
    """

    slots = ("m", "v")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.9,
        momentum2: float = 0.999,
        delta: float = 1e-8,
        **kw: Any,
    ) -> None:
        _check_range("momentum (Adam beta1)", momentum, 0.0, 1.0, "Typical value: 0.9.")
        _check_range("momentum2 (Adam beta2)", momentum2, 0.0, 1.0, "Typical value: 0.999.")
        super().__init__(params, lr, momentum=momentum, momentum2=momentum2, delta=delta, **kw)

    def _update(self, g, state, rate, group):
        b1, b2, t = group["momentum"], group["momentum2"], state["step"]
        m, v = state["m"], state["v"]
        m.mul_(b1).add_(g, alpha=float(_f32(1) - _f32(b1)))
        v.mul_(b2).addcmul_(g, g, value=float(_f32(1) - _f32(b2)))
        # pow(float, int) is evaluated in double by std::pow, then stored as float.
        correction = math.sqrt(1.0 - math.pow(float(_f32(b2)), t)) / (1.0 - math.pow(float(_f32(b1)), t))
        scale = float(_f32(rate) * _f32(correction))
        return m.div(v.sqrt().add_(group["delta"])).mul_(scale)


SOLVER_TYPES: dict[str, type[CaffeOptimizer]] = {
    "SGD": CaffeSGD,
    "Nesterov": CaffeNesterov,
    "AdaGrad": CaffeAdaGrad,
    "RMSProp": CaffeRMSProp,
    "AdaDelta": CaffeAdaDelta,
    "Adam": CaffeAdam,
}


def make_optimizer(spec: Any, params: Any) -> CaffeOptimizer:
    """The Caffe optimizer of ``spec.type`` over params or param groups.

    Args:
        spec: a :class:`sparkdp.caffe.solver.SolverSpec` (or anything with its fields).
        params: tensors or torch param groups (may carry ``lr_mult``/``decay_mult``).
    """
    cls = SOLVER_TYPES[spec.type]
    # each type's own hyper-parameters (momentum, delta, ...) are named as the solver's fields
    names = [
        n
        for n, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD and n not in ("self", "params", "lr")
    ]
    common = dict(lr=spec.base_lr, weight_decay=spec.weight_decay, regularization=spec.regularization_type)
    return cls(params, **common, **{n: getattr(spec, n) for n in names})
