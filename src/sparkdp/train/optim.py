"""Optimizers and losses given as names, classes, factories or instances.

A user's optimizer instance lives on the driver over the driver's copy of the
model; each worker needs the same optimizer over its own copy. We record the
class, its hyper-parameters and each param group's members by parameter index,
and rebuild it in the worker (composition, no class synthesis). Its state travels between
stages and into checkpoints as bytes, without pickle (``sparkdp.state``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import Optimizer

from .. import state as state_io
from ..errors import ConfigError
from .batch import ModelLoss

OPTIMIZERS: dict[str, type[Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
}
DEFAULT_OPTIMIZER_ARGS: dict[str, dict[str, Any]] = {"sgd": {"lr": 0.01, "momentum": 0.9}}

LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": F.cross_entropy,
    "nll": F.nll_loss,
    "mse": F.mse_loss,
    "l1": F.l1_loss,
    "bce_with_logits": F.binary_cross_entropy_with_logits,
}


@dataclass
class OptimizerFactory:
    """Builds the same optimizer over any copy of the model."""

    cls: type[Optimizer] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    groups: list[tuple[list[int], dict[str, Any]]] | None = None  # (param indices, group options)
    fn: Callable[..., Optimizer] | None = None

    def build(self, model: nn.Module) -> Optimizer:
        params = list(model.parameters())
        if self.fn is not None:
            opt = self.fn(params) if _takes_one_arg(self.fn) else self.fn(model)
            if not isinstance(opt, Optimizer):
                raise ConfigError(
                    f"the optimizer factory returned {type(opt).__name__}, not a torch.optim.Optimizer."
                )
            return opt
        assert self.cls is not None
        if self.groups is None:
            return self.cls(params, **self.kwargs)
        return self.cls(
            [{"params": [params[i] for i in idx], **opts} for idx, opts in self.groups], **self.kwargs
        )


def _takes_one_arg(fn: Callable) -> bool:
    try:
        return len(inspect.signature(fn).parameters) >= 1
    except (TypeError, ValueError):
        return True


def optimizer_factory(optimizer: Any, model: nn.Module, **kwargs: Any) -> OptimizerFactory:
    """Accept ``"sgd"`` (+ kwargs such as lr), an Optimizer class, an instance, or ``params -> Optimizer``."""
    if isinstance(optimizer, OptimizerFactory):
        return optimizer
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key not in OPTIMIZERS:
            raise ConfigError(
                f"Unknown optimizer {optimizer!r}. Available: {', '.join(sorted(OPTIMIZERS))}; "
                "or pass a torch.optim.Optimizer instance or class."
            )
        return OptimizerFactory(OPTIMIZERS[key], {**DEFAULT_OPTIMIZER_ARGS.get(key, {}), **kwargs})
    if isinstance(optimizer, type) and issubclass(optimizer, Optimizer):
        return OptimizerFactory(optimizer, dict(kwargs))
    if isinstance(optimizer, Optimizer):
        index = {id(p): i for i, p in enumerate(model.parameters())}
        groups = []
        for group in optimizer.param_groups:
            missing = [p for p in group["params"] if id(p) not in index]
            if missing:
                raise ConfigError(
                    "the optimizer holds parameters that are not the model's; build it with "
                    "optimizer = torch.optim.X(model.parameters(), ...) over the model you pass."
                )
            opts = {k: v for k, v in group.items() if k != "params"}
            groups.append(([index[id(p)] for p in group["params"]], opts))
        return OptimizerFactory(type(optimizer), {}, groups)
    if callable(optimizer):
        return OptimizerFactory(fn=optimizer)
    raise ConfigError(
        f"cannot use {type(optimizer).__name__} as an optimizer; pass a name "
        f"({', '.join(sorted(OPTIMIZERS))}), a torch.optim class or instance, or a factory."
    )


def resolve_loss(loss: Any) -> Callable[..., Any]:
    """A loss name, ``"model"`` (the model computes its loss: ``train.batch.ModelLoss``), a
    ``ModelLoss``, or a callable ``(outputs, labels) -> loss``."""
    if isinstance(loss, ModelLoss):
        return loss
    if isinstance(loss, str):
        if loss == "model":
            return ModelLoss()
        if loss not in LOSSES:
            raise ConfigError(
                f"Unknown loss {loss!r}. Available: {', '.join(sorted(LOSSES))}, or 'model' (the "
                "model's output carries the loss); or pass a callable (outputs, labels) -> scalar "
                "tensor, or sparkdp.model_loss(fn) for fn(model, batch) -> loss."
            )
        return LOSSES[loss]
    if callable(loss):
        return loss
    raise ConfigError(f"loss must be a name or a callable; got {type(loss).__name__}.")


def optimizer_state(
    optimizer: torch.optim.Optimizer, scheduler: Any = None, state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An optimizer's (and its scheduler's) state, as :func:`optimizer_state_to_bytes` encodes it;
    ``state``: the optimizer's state as the strategy gathered it (default: its ``state_dict()``)."""
    sched = None
    if scheduler is not None and hasattr(scheduler, "state_dict"):
        sched = {k: v for k, v in scheduler.state_dict().items() if not callable(v)}
    return {"optimizer": optimizer.state_dict() if state is None else state, "scheduler": sched}


def optimizer_state_to_bytes(
    optimizer: torch.optim.Optimizer, scheduler: Any = None, state: dict[str, Any] | None = None
) -> bytes:
    """An optimizer's (and its scheduler's) state as bytes, without pickle (``sparkdp.state``)."""
    return state_io.to_bytes(optimizer_state(optimizer, scheduler, state))
