"""Caffe solvers (``solver.prototxt``) on top of torch: settings, rate schedule, update.

:func:`load_solver` reads a SolverParameter (file, text or parsed Message) into a
frozen :class:`SolverSpec` and returns a :class:`CaffeSolver` over any torch
parameters.  One :meth:`CaffeSolver.step` is Caffe's ``ApplyUpdate``: clip the
global gradient norm, divide by ``iter_size``, regularize, compute the update of
the solver type, apply it, ``iter += 1``.

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
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .lr_policy import CaffeLRScheduler, learning_rate
from .optim import make_optimizer
from .solver_spec import SolverSpec, read_solver_spec
from .textformat import Message

__all__ = ["CaffeSolver", "SolverSpec", "load_solver", "read_solver_spec"]

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


class CaffeSolver:
    """Caffe's solver loop pieces over torch parameters.

    The caller does ``zero_grad()``, ``iter_size`` forward/backward passes (the
    gradients accumulate), then :meth:`step`.  In data-parallel training the
    gradients are averaged across workers before :meth:`step`, as Caffe's NCCL
    solver does.

    Attributes:
        spec: the solver settings.
        optimizer: the :mod:`sparkdp.caffe.optim` optimizer of ``spec.type``.
        scheduler: a :class:`CaffeLRScheduler` holding the rate of the next update.
        iter: updates applied so far.
    """

    def __init__(self, spec: SolverSpec, params_or_net: Any) -> None:
        self.spec = spec
        self.optimizer = make_optimizer(spec, _param_groups(params_or_net, spec))
        self.scheduler = CaffeLRScheduler(self.optimizer, spec)
        self.iter = 0

    # Plain views of the settings a training loop needs.
    max_iter = property(lambda self: self.spec.max_iter)
    test_interval = property(lambda self: self.spec.test_interval)
    test_iter = property(lambda self: self.spec.test_iter)
    snapshot = property(lambda self: self.spec.snapshot)
    snapshot_prefix = property(lambda self: self.spec.snapshot_prefix)
    display = property(lambda self: self.spec.display)
    iter_size = property(lambda self: self.spec.iter_size)

    @property
    def rate(self) -> float:
        """The rate the next :meth:`step` uses (before ``lr_mult``)."""
        return float(self.scheduler.get_last_lr()[0])

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
        """Clip -> normalize -> regularize -> update -> ``iter += 1``."""
        grads = [p.grad for p in self.params() if p.grad is not None]
        clip = self.spec.clip_gradients
        if clip >= 0 and grads:
            # Caffe clips the un-normalised iter_size sum, before weight decay.
            norm = math.sqrt(float(sum(g.float().pow(2).sum() for g in grads)))
            if norm > clip:
                for g in grads:
                    g.mul_(clip / norm)
        if self.spec.iter_size != 1:
            scale = float(torch.tensor(1.0, dtype=torch.float32) / self.spec.iter_size)
            for g in grads:
                g.mul_(scale)
        self.optimizer.step()
        self.iter += 1
        self.scheduler.step()

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
            "current_step": self.scheduler.previous_step,
            "history": self.optimizer.history(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output (same solver type and parameters)."""
        if state.get("type", self.spec.type) != self.spec.type:
            raise ConfigError(
                f"solver state was saved by a {state['type']} solver; this solver is {self.spec.type}. "
                "Use the same solver type to resume, or start without the state."
            )
        self.iter = int(state["iter"])
        self.optimizer.load_history(list(state["history"]), self.iter)
        self.scheduler.restore(self.iter, int(state["current_step"]))


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
