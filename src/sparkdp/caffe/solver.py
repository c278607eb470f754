"""Caffe solvers (``solver.prototxt``) on top of torch: one solver core, two faces.

:class:`CaffeSolverHooks` is the core: the parts of Caffe's ``Solver::Step`` around the
update (``clip_gradients``, ``iter += 1``, the ``lr_policy`` rate of the next iteration)
as step hooks on the solver's optimizer (:mod:`sparkdp.caffe.optim`).  It is used

* standalone by :class:`CaffeSolver` (:func:`load_solver`), Caffe's solver loop pieces
  over any torch parameters, and
* inside sparkdp's training loop through :class:`CaffeOptimizerFactory`, which rebuilds
  the same optimizer with the same hooks on every worker's copy of the model.

The iteration counter and multistep's ``current_step`` live in the optimizer's param
groups, so they travel with ``optimizer.state_dict()``.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> solver = load_solver('base_lr: 0.1 lr_policy: "fixed" momentum: 0.9', [w])
    >>> w.grad = torch.ones(3); solver.step(); solver.iter
    1
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch import nn
from torch.optim import Optimizer

from ..errors import ConfigError
from .lr_policy import advance_current_step, learning_rate
from .optim import make_optimizer
from .solver_spec import SolverSpec, read_solver_spec
from .textformat import Message

_Opt = TypeVar("_Opt", bound=Optimizer)

__all__ = [
    "CaffeOptimizerFactory",
    "CaffeSolver",
    "CaffeSolverHooks",
    "SolverSpec",
    "load_solver",
    "read_solver_spec",
]


def _param_groups(params_or_net: Any, spec: SolverSpec) -> list[dict[str, Any]]:
    """Torch param groups with ``lr_mult``/``decay_mult``; lr and decay from the spec."""
    if hasattr(params_or_net, "caffe_layers") and callable(getattr(params_or_net, "param_groups", None)):
        groups = list(params_or_net.param_groups(spec.base_lr, spec.weight_decay))
    elif isinstance(params_or_net, nn.Module):
        groups = [{"params": list(params_or_net.parameters())}]
    elif isinstance(params_or_net, torch.Tensor):
        groups = [{"params": [params_or_net]}]
    elif isinstance(params_or_net, Iterable):
        items = list(params_or_net)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
    else:
        raise ConfigError(
            f"cannot take parameters from a {type(params_or_net).__name__}; pass a CaffeNet, an "
            "nn.Module, an iterable of tensors, or torch param-group dicts."
        )
    out = []
    for group in groups:
        g = dict(group)
        g["params"] = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
        # The rate is set by the scheduler and multiplied by lr_mult inside the
        # optimizer, so a group's own lr/weight_decay (possibly pre-multiplied) is replaced.
        g["lr"], g["weight_decay"] = spec.base_lr, spec.weight_decay
        g.setdefault("lr_mult", 1.0)
        g.setdefault("decay_mult", 1.0)
        out.append(g)
    return out


class CaffeSolverHooks:
    """The parts of Caffe's ``Solver::Step`` around the update, as optimizer step hooks.

    Before each step: ``clip_gradients`` on the global L2 norm.  The gradients are the
    *mean* of ``iter_size`` passes, so the threshold is ``clip / iter_size``: the same as
    Caffe clipping the un-normalised sum.  After it: ``iter += 1`` and every group's ``lr``
    set to the ``lr_policy`` rate of the next iteration (the Caffe optimizers multiply by
    ``lr_mult``).  Each param group keeps ``caffe_iter`` (updates applied) and
    ``caffe_step`` (multistep's counter as Caffe's ``SolverState.current_step`` stores it:
    after the rate of iteration ``caffe_iter - 1``).
    """

    def __init__(self, spec: SolverSpec) -> None:
        self.spec = spec

    def attach(self, optimizer: _Opt) -> _Opt:
        for group in optimizer.param_groups:
            group.setdefault("caffe_iter", 0)
            group.setdefault("caffe_step", 0)
        self.set_rate(optimizer)
        optimizer.register_step_pre_hook(self.before_step)
        optimizer.register_step_post_hook(self.after_step)
        return optimizer

    def _counters(self, optimizer: Optimizer) -> tuple[int, int]:
        """(iteration, multistep counter for this iteration's rate)."""
        first = optimizer.param_groups[0]
        it = int(first["caffe_iter"])
        return it, advance_current_step(self.spec.stepvalue, it, int(first["caffe_step"]))

    def set_rate(self, optimizer: Optimizer) -> None:
        """Every group's ``lr`` := Caffe's rate for the next update."""
        rate = learning_rate(self.spec, *self._counters(optimizer))
        for group in optimizer.param_groups:
            group["lr"] = rate

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
        it, step = self._counters(optimizer)
        for group in optimizer.param_groups:
            group["caffe_iter"], group["caffe_step"] = it + 1, step
        self.set_rate(optimizer)


class CaffeSolver:
    """Caffe's solver loop pieces over torch parameters.

    The caller does ``zero_grad()``, ``iter_size`` forward/backward passes (the
    gradients accumulate), then :meth:`step`.  In data-parallel training the
    gradients are averaged across workers before :meth:`step`, as Caffe's NCCL
    solver does.

    Attributes:
        spec: the solver settings.
        optimizer: the :mod:`sparkdp.caffe.optim` optimizer of ``spec.type``, with
            :class:`CaffeSolverHooks` attached.
        iter: updates applied so far.
    """

    def __init__(self, spec: SolverSpec, params_or_net: Any) -> None:
        self.spec = spec
        self._hooks = CaffeSolverHooks(spec)
        self.optimizer = self._hooks.attach(make_optimizer(spec, _param_groups(params_or_net, spec)))

    # Plain views of the settings a training loop needs.
    max_iter = property(lambda self: self.spec.max_iter)
    test_interval = property(lambda self: self.spec.test_interval)
    test_iter = property(lambda self: self.spec.test_iter)
    snapshot = property(lambda self: self.spec.snapshot)
    snapshot_prefix = property(lambda self: self.spec.snapshot_prefix)
    display = property(lambda self: self.spec.display)
    iter_size = property(lambda self: self.spec.iter_size)

    @property
    def iter(self) -> int:
        """Updates applied so far."""
        return int(self.optimizer.param_groups[0]["caffe_iter"])

    @property
    def rate(self) -> float:
        """The rate the next :meth:`step` uses (before ``lr_mult``)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def lr_at(self, it: int) -> float:
        """Caffe's rate at iteration ``it`` (fresh-run multistep counter)."""
        return learning_rate(self.spec, it)

    def params(self) -> list[torch.Tensor]:
        """The learnable parameters, in Caffe's ``learnable_params`` order."""
        return self.optimizer.learnable()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Same as ``optimizer.zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Normalize -> clip -> regularize -> update -> ``iter += 1``.

        The caller accumulated ``iter_size`` passes; dividing their sum first turns it
        into the mean the hooks clip at ``clip / iter_size``, Caffe's clip of the sum.
        """
        if self.spec.iter_size != 1:
            scale = float(torch.tensor(1.0, dtype=torch.float32) / self.spec.iter_size)
            for p in self.params():
                if p.grad is not None:
                    p.grad.mul_(scale)
        self.optimizer.step()

    def test_due(self, it: int | None = None) -> bool:
        """Whether Caffe runs the test nets before the update of iteration ``it``."""
        it = self.iter if it is None else it
        return (
            self.test_interval > 0
            and it % self.test_interval == 0
            and (it > 0 or self.spec.test_initialization)
        )

    def snapshot_due(self, it: int | None = None) -> bool:
        """Whether Caffe snapshots after reaching iteration ``it`` (default: now)."""
        it = self.iter if it is None else it
        return self.snapshot > 0 and it > 0 and it % self.snapshot == 0

    def snapshot_path(self, it: int | None = None, extension: str = ".caffemodel") -> Path:
        """``{snapshot_prefix}_iter_{N}.caffemodel``, Caffe's ``SnapshotFilename``."""
        it = self.iter if it is None else it
        return Path(f"{self.snapshot_prefix}_iter_{it}{extension}")

    def write_snapshot(self, net: Any) -> Path:
        """Save ``net``'s weights (binary proto) to :meth:`snapshot_path`; returns the path."""
        from .weights import save_weights

        path = self.snapshot_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        save_weights(net, path)
        return path

    def state_dict(self) -> dict[str, Any]:
        """Caffe's SolverState: ``iter``, ``current_step`` and ``history`` tensors."""
        return {
            "type": self.spec.type,
            "iter": self.iter,
            "current_step": int(self.optimizer.param_groups[0]["caffe_step"]),
            "history": self.optimizer.history(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output (same solver type and parameters)."""
        if state.get("type", self.spec.type) != self.spec.type:
            raise ConfigError(
                f"solver state was saved by a {state['type']} solver; this solver is {self.spec.type}. "
                "Use the same solver type to resume, or start without the state."
            )
        iteration = int(state["iter"])
        for group in self.optimizer.param_groups:
            group["caffe_iter"], group["caffe_step"] = iteration, int(state["current_step"])
        self.optimizer.load_history(list(state["history"]), iteration)
        self._hooks.set_rate(self.optimizer)


def load_solver(solver: Message | str | os.PathLike[str] | SolverSpec, params_or_net: Any) -> CaffeSolver:
    """Read a Caffe solver and build a :class:`CaffeSolver` over the parameters.

    Args:
        solver: path to a ``solver.prototxt``, its text, a parsed Message or a spec.
        params_or_net: a CaffeNet (its ``param_groups`` give lr_mult/decay_mult), an
            ``nn.Module``, an iterable of tensors or of torch param-group dicts.

    Raises:
        ConfigError: on an unknown field, policy or type, or invalid values.
    """
    return CaffeSolver(read_solver_spec(solver), params_or_net)


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
            groups = cast(Any, model).param_groups(spec.base_lr, spec.weight_decay)  # duck-typed CaffeNet
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
