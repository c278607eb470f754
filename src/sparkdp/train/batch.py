"""Batches as the training loop sees them, and losses a model computes itself.

A batch is ``(x, y)``: ``x`` a tensor or a dict of tensors (dict batches: ``input_ids``,
``attention_mask``, ``labels``...), ``y`` the labels or None when they live in the dict.

``loss`` is either a classic ``(outputs, labels) -> loss`` function, or a :class:`ModelLoss`
(``loss="model"`` or :func:`model_loss`): the model's own output carries the loss (a Hugging
Face ``ModelOutput``'s ``.loss``, or a dict's ``"loss"``), or ``fn(model, batch)`` returns it.
The two kinds never look alike: a ``ModelLoss`` is a class of its own, so a two-argument
callable is always the classic kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError

#: the label value Hugging Face models (and ``F.cross_entropy``'s default) leave out of the loss
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelLoss:
    """The loss comes from the model: its output's ``.loss`` / ``["loss"]`` (``fn`` None), or
    ``fn(model, batch) -> loss`` (``batch`` the dict, or ``(x, y)`` for tensor batches).

    Attributes:
        fn: what computes the loss from the model and the batch; None: the model's output.
        causal: a dict batch's ``labels`` are shifted inside the model (a causal language
            model predicts token t+1 from tokens <= t, so each row's first label is never
            predicted); this decides how many tokens a batch's loss is the mean over, which
            weighs batches in the evaluated token-mean loss and perplexity.
    """

    fn: Callable[[nn.Module, Any], Any] | None = None
    causal: bool = True

    def __call__(self, model: nn.Module, x: Any, y: Any) -> tuple[torch.Tensor, Any]:
        """``(loss, output)`` of one batch (the output is None when ``fn`` computes the loss)."""
        if self.fn is not None:
            return _as_loss(self.fn(model, x if y is None else (x, y)), "the model_loss function"), None
        out = call_model(model, x) if y is None or isinstance(x, Mapping) else model(x, y)
        return _as_loss(out, f"{type(model).__name__}'s output"), out

    def tokens(self, x: Any) -> int | None:
        """How many label tokens this batch's loss averages over (``labels`` != -100), or None
        when the batch has no 2-D integer ``labels``."""
        labels = x.get("labels") if isinstance(x, Mapping) else None
        if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or labels.is_floating_point():
            return None
        counted = labels[:, 1:] if self.causal else labels
        return int((counted != IGNORE_INDEX).sum())


def model_loss(fn: Callable[[nn.Module, Any], Any] | None = None, *, causal: bool = True) -> ModelLoss:
    """A loss computed with the model: ``fit(loss=sparkdp.model_loss(fn))`` with ``fn(model, batch)
    -> scalar loss`` (``batch``: the dict of a dict batch, else ``(x, y)``). Without ``fn`` it is
    ``loss="model"``: the model's output carries the loss. ``causal``: see :class:`ModelLoss`."""
    if fn is not None and not callable(fn):
        raise ConfigError(f"model_loss takes a function (model, batch) -> loss; got {type(fn).__name__}.")
    return ModelLoss(fn, causal)


def _as_loss(out: Any, what: str) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    if loss is None and isinstance(out, torch.Tensor):
        loss = out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = (
            f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(out).__name__
        )
        raise ConfigError(
            f"loss='model' needs a scalar loss from {what}: an attribute .loss (a Hugging Face "
            f"ModelOutput, given labels in the batch), a key 'loss', or a scalar tensor; got {got}. "
            "Put 'labels' in the batch, or pass a classic loss (outputs, labels) -> loss."
        )
    return loss.reshape(())


def call_model(model: nn.Module, x: Any) -> Any:
    """``model(**x)`` for a dict batch, ``model(x)`` otherwise."""
    return model(**x) if isinstance(x, Mapping) else model(x)


def forward_loss(model: nn.Module, loss: Callable[..., Any], x: Any, y: Any) -> tuple[torch.Tensor, Any]:
    """``(loss, output)`` of one batch with either kind of loss."""
    if isinstance(loss, ModelLoss):
        return loss(model, x, y)
    if y is None:
        raise ConfigError(
            "this batch has no labels (a dict batch without label=), so a loss (outputs, labels) "
            "cannot apply; pass loss='model' for a model that computes its own loss, or name the "
            "label column / give labels."
        )
    out = call_model(model, x)
    return loss(out, y), out


def to_device(x: Any, device: torch.device) -> Any:
    """A batch part (a tensor, a dict of tensors, or None) on ``device``."""
    if isinstance(x, Mapping):
        return {k: v.to(device) for k, v in x.items()}
    return None if x is None else x.to(device)


def batch_rows(x: Any) -> int:
    """Rows (examples) in a batch part."""
    return len(next(iter(x.values()))) if isinstance(x, Mapping) else len(x)


def training_tokens(x: Any) -> int | None:
    """The tokens a language model's dict batch trains on: its ``attention_mask``'s sum (padding
    left out), else every position of its ``input_ids`` (packed blocks have no padding); None
    for a batch without ``input_ids``."""
    if not isinstance(x, Mapping) or not isinstance(ids := x.get("input_ids"), torch.Tensor):
        return None
    mask = x.get("attention_mask")
    return int(mask.sum()) if isinstance(mask, torch.Tensor) else ids.numel()


def describe_batch(x: Any) -> str:
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k!r}: {tuple(v.shape)} {v.dtype}" for k, v in x.items()) + "}"
    return f"{tuple(x.shape)} ({x.dtype})"


__all__ = [
    "IGNORE_INDEX",
    "ModelLoss",
    "batch_rows",
    "call_model",
    "describe_batch",
    "forward_loss",
    "model_loss",
    "to_device",
    "training_tokens",
]
