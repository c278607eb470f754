"""The first batch's checks: the model and the loss take it, and its labels fit the model.

torch's own errors for a batch the model cannot take name a matrix shape deep inside a layer;
these name the batch, the model's input or output and what to change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, DataError
from .batch import ModelLoss, describe_batch, forward_loss


def check_batch(model: nn.Module, loss_fn: Callable, x: Any, y: Any) -> Any:
    """Run one forward pass and the loss on a batch; turn torch's shape errors into ours.
    Returns the model's output."""
    if isinstance(loss_fn, ModelLoss) or not isinstance(x, torch.Tensor):
        try:
            return forward_loss(model, loss_fn, x, y)[1]
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(
                f"the model and loss cannot take a batch {describe_batch(x)}: {exc}. Check the model's "
                "arguments (a dict batch is passed as model(**batch)) against the data."
            ) from exc
    try:
        out = model(x)
    except RuntimeError as exc:
        raise ConfigError(
            f"the model cannot take a batch of features of shape {tuple(x.shape)} "
            f"({x.dtype}): {exc}. Check the model's input layer against the data."
        ) from exc
    check_labels(out, y)
    try:
        loss_fn(out, y)
    except (RuntimeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"the loss cannot compare model outputs of shape {_shapes(out)} with labels of "
            f"shape {tuple(y.shape)} ({y.dtype}): {exc}"
        ) from exc
    return out


def _shapes(out: Any) -> Any:
    return tuple(out.shape) if isinstance(out, torch.Tensor) else [tuple(o.shape) for o in out]


def class_scores(out: Any, y: torch.Tensor | None) -> bool:
    """True when ``out`` is one (rows, classes) tensor and ``y`` integer class labels: accuracy applies.
    (A model may return a tuple, e.g. a Siamese net's two features for a pair loss.)"""
    return isinstance(out, torch.Tensor) and out.dim() == 2 and y is not None and not y.is_floating_point()


def check_labels(out: torch.Tensor, y: torch.Tensor) -> None:
    if class_scores(out, y) and y.dim() == 1 and len(y):
        classes = out.shape[1]
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= classes:
            raise DataError(
                f"labels must lie in [0, {classes}) for a model with {classes} outputs, but this "
                f"batch has labels from {lo} to {hi}. Fix the labels or the model's output size."
            )


__all__ = ["check_batch", "check_labels", "class_scores"]
