"""A Caffe solver's rate policy and gradient clipping as hooks on a torch optimizer.

:class:`CaffeOptimizerFactory` rebuilds, on every worker's copy of the model, the solver's
optimizer over the ``lr_mult``/``decay_mult`` parameter groups with :class:`CaffeSolverHooks`
attached; the iteration counter lives in the optimizer's param groups, so it survives
``optimizer.state_dict()`` round trips, and the same optimizer serves asynchronous
strategies as their worker optimizer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from ..errors import ConfigError
from .lr_policy import advance_current_step, learning_rate
from .optim import make_optimizer
from .solver_spec import SolverSpec

log = logging.getLogger(__name__)



class CaffeSolverHooks:
    """The parts of Caffe's ``Solver::Step`` around the update, as optimizer step hooks.

    Before each step: ``clip_gradients`` (global L2 norm; with ``iter_size: k`` the
    gradients are the mean of k batches, so the threshold is ``clip / k``, as Caffe clips
    the un-normalized sum).  After it: ``iter += 1`` and every group's ``lr`` set to the
    ``lr_policy`` rate of the next iteration (the Caffe optimizers multiply by ``lr_mult``).
    ``caffe_iter`` and multistep's ``caffe_step`` are kept in each param group, so they
    travel with ``optimizer.state_dict()``.
    """

    def __init__(self, spec: SolverSpec) -> None:
        self.spec = spec

    def attach(self, optimizer: Optimizer) -> Optimizer:
        for group in optimizer.param_groups:
            group.setdefault("caffe_iter", 0)
            group.setdefault("caffe_step", 0)
        self._set_rate(optimizer)
        optimizer.register_step_pre_hook(self.before_step)
        optimizer.register_step_post_hook(self.after_step)
        return optimizer

    def _set_rate(self, optimizer: Optimizer) -> None:
        first = optimizer.param_groups[0]
        it = int(first["caffe_iter"])
        step = advance_current_step(self.spec.stepvalue, it, int(first["caffe_step"]))
        rate = learning_rate(self.spec, it, step)
        for group in optimizer.param_groups:
            group["lr"], group["caffe_step"], group["caffe_iter"] = rate, step, it

    @torch.no_grad()
    def before_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        clip = self.spec.clip_gradients
        if clip < 0:
            return
        grads = [
            p.grad
            for g in optimizer.param_groups
            for p in g["params"]
            if p.requires_grad and p.grad is not None
        ]
        if not grads:
            return
        norm = math.sqrt(float(sum(g.float().pow(2).sum() for g in grads)))
        threshold = clip / self.spec.iter_size
        if norm > threshold:
            for g in grads:
                g.mul_(threshold / norm)

    def after_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            group["caffe_iter"] = int(group["caffe_iter"]) + 1
        self._set_rate(optimizer)


class CaffeOptimizerFactory:
    """``params -> Optimizer``: the solver's optimizer over the net's ``lr_mult`` groups.

    Made on the driver from the model; called in each worker with
    ``list(model.parameters())`` of the worker's copy, whose parameters it groups by
    index (the order ``parameters()`` gives is the same in every copy).  Picklable.
    """

    def __init__(self, spec: SolverSpec, model: nn.Module) -> None:
        self.spec = spec
        params = list(model.parameters())
        index = {id(p): i for i, p in enumerate(params)}
        self.num_params = len(params)
        if hasattr(model, "param_groups") and hasattr(model, "caffe_layers"):
            groups = model.param_groups(spec.base_lr, spec.weight_decay)
            self.groups = [
                ([index[id(p)] for p in g["params"]], float(g["lr_mult"]), float(g["decay_mult"]))
                for g in groups
            ]
        else:  # any other module: one group, multipliers 1
            self.groups = [([i for i, p in enumerate(params) if p.requires_grad], 1.0, 1.0)]

    def __call__(self, params: Iterable[torch.Tensor]) -> Optimizer:
        params = list(params.parameters()) if isinstance(params, nn.Module) else list(params)
        if len(params) != self.num_params:
            raise ConfigError(
                f"the Caffe solver's optimizer was made for a model with {self.num_params} parameter tensors, "
                f"but got {len(params)}; build the factory from the model being trained."
            )
        groups = [
            {"params": [params[i] for i in idx], "lr_mult": lr_mult, "decay_mult": decay_mult}
            for idx, lr_mult, decay_mult in self.groups
            if idx
        ]
        return CaffeSolverHooks(self.spec).attach(make_optimizer(self.spec, groups))

    def __repr__(self) -> str:
        mults = sorted({(lr, dm) for _, lr, dm in self.groups})
        return (
            f"CaffeOptimizerFactory({self.spec.type}, base_lr={self.spec.base_lr}, "
            f"lr_policy={self.spec.lr_policy!r}, (lr_mult, decay_mult)={mults})"
        )


