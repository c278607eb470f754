"""What a language model's embeddings can take, checked against a batch before training.

An ``nn.Embedding`` given an id at or above its size fails with a bare ``index out of range in
self``, deep inside the first forward pass that meets one (on a worker, after Spark started);
a block longer than the model's positions fails the same way in the position embedding.
:class:`TokenLimits` names the column, the largest id or the length, and the model's limit; the
driver checks a sample before Spark starts and every worker checks each batch it trains on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .batch import IGNORE_INDEX


def vocabulary_size(model: nn.Module) -> int | None:
    """Rows of the model's input embedding: a Hugging Face model's ``get_input_embeddings()``,
    else a ``vocab_size`` attribute (sparkdp's ``gpt``); None when the model says neither."""
    getter = getattr(model, "get_input_embeddings", None)
    embedding = getter() if callable(getter) else None
    if isinstance(embedding, nn.Embedding):
        return int(embedding.num_embeddings)
    size = getattr(model, "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def position_count(model: nn.Module) -> int | None:
    """The longest sequence the model's absolute positions cover: its config's ``n_positions`` /
    ``max_position_embeddings``, or a ``block_size`` attribute; None when it has none (e.g.
    rotary positions without a stated limit)."""
    config = getattr(model, "config", None)
    for owner, name in ((config, "n_positions"), (config, "max_position_embeddings"), (model, "block_size")):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True)
class TokenLimits:
    """What a model's embeddings take: ids below ``vocab``, sequences of at most ``positions``
    (None: not stated). :meth:`check` costs a max and a min per column, so the training loop runs
    it on every batch, before the batch leaves the CPU: a bad id anywhere in the data is refused
    by name, not only one in the first batches."""

    model: str
    vocab: int | None
    positions: int | None

    @classmethod
    def of(cls, model: nn.Module) -> TokenLimits | None:
        """``model``'s limits, or None when it states neither (nothing to check)."""
        vocab, positions = vocabulary_size(model), position_count(model)
        if vocab is None and positions is None:
            return None
        return cls(type(model).__name__, vocab, positions)

    def check(self, x: Any, where: str = "the data") -> None:
        """Refuse a dict batch whose ``input_ids`` / ``labels`` hold ids outside the vocabulary, or
        whose sequences are longer than the positions (a ``ConfigError`` naming both). Anything
        else (tensor batches, float columns) passes unchecked. ``where``: what the error calls
        the batch."""
        if not isinstance(x, Mapping) or not isinstance(ids := x.get("input_ids"), torch.Tensor):
            return
        if ids.is_floating_point() or ids.dim() != 2 or not ids.numel():
            return
        if self.vocab is not None:
            for column in ("input_ids", "labels"):
                values = x.get(column)
                if not isinstance(values, torch.Tensor) or values.is_floating_point() or not values.numel():
                    continue
                if _outside(values, self.vocab, ignored=column == "labels"):
                    self._refuse_ids(column, values, where)
        if self.positions is not None and ids.shape[1] > self.positions:
            raise ConfigError(
                f"{where}: blocks of {ids.shape[1]} tokens, but {self.model} has {self.positions} "
                f"positions. Make blocks of at most {self.positions} tokens (block_size), or a model "
                "with more positions."
            )

    def _refuse_ids(self, column: str, values: torch.Tensor, where: str) -> None:
        counted = values[values != IGNORE_INDEX] if column == "labels" else values
        low, high, vocab = int(counted.min()), int(counted.max()), self.vocab
        assert vocab is not None
        raise ConfigError(
            f"{where}: {column} holds token ids from {low} to {high}, but {self.model} embeds "
            f"{vocab} tokens (ids 0..{vocab - 1}). Tokenize with the model's own tokenizer, or give "
            f"the model a vocabulary of at least {high + 1}."
        )


def _outside(values: torch.Tensor, vocab: int, *, ignored: bool) -> bool:
    """Whether ``values`` hold an id outside ``0..vocab-1`` (with ``ignored``, the loss's
    ignore index -100 is allowed): one max, one min, and a mask only when a negative id exists."""
    if int(values.max()) >= vocab:
        return True
    if int(values.min()) >= 0:
        return False
    return not ignored or bool(((values < 0) & (values != IGNORE_INDEX)).any())


def check_token_batch(model: nn.Module, x: Any, where: str = "the data") -> None:
    """:meth:`TokenLimits.check` with ``model``'s limits (a model that states none passes)."""
    limits = TokenLimits.of(model)
    if limits is not None:
        limits.check(x, where)


__all__ = ["TokenLimits", "check_token_batch", "position_count", "vocabulary_size"]
