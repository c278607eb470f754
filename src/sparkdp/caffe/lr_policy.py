"""Caffe's learning-rate policies (``SGDSolver::GetLearningRate``), bit-faithful.

Caffe computes the rate in the solver's ``Dtype`` (float32) from float32 fields,
so values here are computed on ``numpy.float32`` operands.  Policies whose C++
expression is ``pow(float, int)`` (step, exp, multistep) are promoted to double by
``std::pow`` and rounded back to float when stored, which is what we do too.

The policies can drive any torch optimizer through :class:`CaffeLRScheduler` (a
``torch.optim.lr_scheduler.LRScheduler``) or :func:`lr_lambda` (for ``LambdaLR``).

Example:
    >>> from sparkdp.caffe.solver_spec import SolverSpec
    >>> spec = SolverSpec(base_lr=0.01, lr_policy="inv", gamma=1e-4, power=0.75)
    >>> learning_rate(spec, 5000)  # float32; docs/algorithms.md §9 quotes 0.0073778795
    0.007377879228442907
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from ..errors import ConfigError
from .solver_spec import LR_POLICIES, SolverSpec

_f32 = np.float32


def multistep_current_step(stepvalue: Sequence[int], it: int) -> int:
    """Caffe's ``current_step`` after ``GetLearningRate`` was called at 0..``it``.

    Caffe advances ``current_step`` by at most one per call, so step ``k`` takes
    effect at ``t_k = max(stepvalue[k], t_{k-1} + 1)``; this closed form lets a pure
    function agree with the stateful solver even for repeated or unsorted values.
    """
    count, prev = 0, -1
    for value in stepvalue:
        t = max(int(value), prev + 1)
        if t > it:
            break
        count, prev = count + 1, t
    return count


def advance_current_step(stepvalue: Sequence[int], it: int, current_step: int) -> int:
    """One call's worth of Caffe's multistep bookkeeping (at most one increment)."""
    if current_step < len(stepvalue) and it >= stepvalue[current_step]:
        return current_step + 1
    return current_step


def learning_rate(spec: SolverSpec, it: int, current_step: int | None = None) -> float:
    """The rate Caffe uses for the update at iteration ``it`` (0 = first update).

    Args:
        spec: the solver settings (``base_lr``, ``lr_policy``, ``gamma``, ...).
        it: number of updates already applied.
        current_step: multistep only; the solver's stateful counter *after* this
            iteration's increment.  ``None`` derives it from ``it`` (fresh run).

    Returns:
        The rate as a Python float holding a float32 value.
    """
    policy = spec.lr_policy
    base = _f32(spec.base_lr)
    gamma = _f32(spec.gamma)
    power = _f32(spec.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":  # SolverSpec guarantees stepsize > 0 here (and max_iter > 0 for poly)
        rate = _f32(float(base) * math.pow(float(gamma), it // spec.stepsize))
    elif policy == "exp":
        rate = _f32(float(base) * math.pow(float(gamma), it))
    elif policy == "inv":
        rate = base * np.power(_f32(1) + gamma * _f32(it), -power)
    elif policy == "multistep":
        step = multistep_current_step(spec.stepvalue, it) if current_step is None else current_step
        rate = _f32(float(base) * math.pow(float(gamma), step))
    elif policy == "poly":
        rate = base * np.power(_f32(1) - _f32(it) / _f32(spec.max_iter), power)
    elif policy == "sigmoid":
        with np.errstate(over="ignore"):  # exp overflow -> rate 0, as in C++
            rate = base * (_f32(1) / (_f32(1) + np.exp(-gamma * (_f32(it) - _f32(spec.stepsize)))))
    else:
        raise ConfigError(f"unknown lr_policy {policy!r}; allowed: {', '.join(LR_POLICIES)}.")
    return float(_f32(rate))


def lr_lambda(spec: SolverSpec) -> Callable[[int], float]:
    """A ``LambdaLR`` factor: ``rate(it) / base_lr`` (closed-form multistep).

    Use with groups whose initial ``lr`` is ``base_lr * lr_mult``.

    Raises:
        ConfigError: if ``base_lr`` is 0 (the factor is undefined).
    """
    if spec.base_lr == 0:
        raise ConfigError("lr_lambda needs base_lr != 0; use CaffeLRScheduler instead.")
    base = float(_f32(spec.base_lr))
    return lambda it: learning_rate(spec, it) / base


class CaffeLRScheduler(LRScheduler):
    """Sets each group's ``lr`` to Caffe's rate for the next iteration.

    ``last_epoch`` is the solver iteration.  Call ``step()`` after
    ``optimizer.step()`` as usual.  For the Caffe optimizers of
    :mod:`sparkdp.caffe.optim` (which multiply by ``lr_mult`` themselves) the group
    ``lr`` is the bare rate; for any other optimizer it is ``rate * lr_mult``
    (``lr_mult`` read from the group, default 1).

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        spec: solver settings.
        last_epoch: -1 for a fresh start (as in torch).
    """

    def __init__(self, optimizer: Optimizer, spec: SolverSpec, last_epoch: int = -1) -> None:
        from .optim import CaffeOptimizer  # local: optim imports nothing from here

        self.spec = spec
        self.current_step = 0  # after this iteration's advance
        self.previous_step = 0  # before it: what Caffe's SolverState stores
        self._applies_mult = isinstance(optimizer, CaffeOptimizer)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float | Tensor]:
        """Rates for iteration ``last_epoch``, advancing multistep's counter once."""
        it = max(self.last_epoch, 0)
        self.previous_step = self.current_step
        self.current_step = advance_current_step(self.spec.stepvalue, it, self.current_step)
        rate = learning_rate(self.spec, it, self.current_step)
        if self._applies_mult:
            return [rate for _ in self.optimizer.param_groups]
        return [rate * float(g.get("lr_mult", 1.0)) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Only plain values (``torch.load(weights_only=True)`` safe)."""
        return {
            "last_epoch": self.last_epoch,
            "current_step": self.current_step,
            "previous_step": self.previous_step,
            "_step_count": self._step_count,
            "_last_lr": list(self._last_lr),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the iteration, multistep counter and group rates."""
        self.last_epoch = int(state_dict["last_epoch"])
        self.current_step = int(state_dict["current_step"])
        self.previous_step = int(state_dict.get("previous_step", self.current_step))
        self._step_count = int(state_dict.get("_step_count", 1))
        self._last_lr = list(state_dict["_last_lr"])
        for group, lr in zip(self.optimizer.param_groups, self._last_lr, strict=True):
            group["lr"] = lr
