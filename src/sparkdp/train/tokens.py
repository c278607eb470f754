"""What a language model's embeddings can take, checked against a batch before training.

An ``nn.Embedding`` given an id at or above its size fails with a bare ``index out of range in
self``, deep inside the first forward pass that meets one (on a worker, after Spark started);
a block longer than the model's positions fails the same way in the position embedding.
:func:`check_token_batch` names the column, the largest id or the length, and the model's limit.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def check_token_batch(model: nn.Module, x: Any, where: str = "the data") -> None:
    """Refuse a dict batch whose ``input_ids`` / ``labels`` hold ids outside the model's
    vocabulary, or whose sequences are longer than its positions (a ``ConfigError`` naming both).
    Anything else (tensor batches, a model without a stated vocabulary) passes unchecked."""
    if not isinstance(x, Mapping) or not isinstance(ids := x.get("input_ids"), torch.Tensor):
        return
    if ids.is_floating_point() or ids.dim() != 2 or not ids.numel():
        return
    vocab, positions = vocabulary_size(model), position_count(model)
    name = type(model).__name__
    if vocab is not None:
        for column in ("input_ids", "labels"):
            values = x.get(column)
            if not isinstance(values, torch.Tensor) or values.is_floating_point() or not values.numel():
                continue
            counted = values[values != IGNORE_INDEX] if column == "labels" else values
            if counted.numel() and (int(counted.max()) >= vocab or int(counted.min()) < 0):
                raise ConfigError(
                    f"{where}: {column} holds token ids from {int(counted.min())} to {int(counted.max())}, "
                    f"but {name} embeds {vocab} tokens (ids 0..{vocab - 1}). Tokenize with the "
                    "model's own tokenizer, or give the model a vocabulary of at least "
                    f"{int(counted.max()) + 1}."
                )
    if positions is not None and ids.shape[1] > positions:
        raise ConfigError(
            f"{where}: blocks of {ids.shape[1]} tokens, but {name} has {positions} positions. Make "
            f"blocks of at most {positions} tokens (block_size), or a model with more positions."
        )


__all__ = ["check_token_batch", "position_count", "vocabulary_size"]
