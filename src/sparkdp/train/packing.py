"""Whether a model keeps packed examples apart: rows holding several examples end to end, each
with ``position_ids`` restarting at 0 (``sparkdp.spark.text.tokenize_examples(packing=True)``).

A Hugging Face model of transformers 5 turns such positions into a block-diagonal causal mask
when it gets no ``attention_mask`` and builds no key/value cache (``config.use_cache=False``,
which the default ``True`` is not, even in training); a model that does not (one without ``position_ids``, an
older transformers, an attention implementation without that path) would let each example
attend to the ones before it in its row. :func:`check_packing` finds out on the driver, before
any Spark job: an example's logits inside its packed row must equal its logits alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError

#: the largest difference between an example's logits packed and alone still taken as equal
#: (float32 on the driver; attention over a different number of keys sums in another order)
TOLERANCE = 1e-3


def check_packing(model: nn.Module, batch: Any) -> None:
    """Refuse a packed dict batch (``position_ids`` restarting inside a row) for a ``model``
    whose examples would attend to each other, with the reason and what to do instead."""
    if not isinstance(batch, Mapping) or "position_ids" not in batch or "input_ids" not in batch:
        return
    found = _second_example(batch["position_ids"])
    if found is None:
        return  # no row of the sample holds two examples: nothing to compare
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        raise ConfigError(
            f"the data is packed (position_ids restart inside a row) but {type(model).__name__}.forward "
            "takes no position_ids, so its examples would attend to each other; tokenize with "
            "packing=False, or train a model that takes position_ids."
        )
    row, start, end = found
    ids = batch["input_ids"][row]
    with _evaluating(model), torch.no_grad():
        packed = _logits(
            model(input_ids=ids[None, :end], position_ids=batch["position_ids"][row][None, :end])
        )
        alone = _logits(model(input_ids=ids[None, start:end], position_ids=torch.arange(end - start)[None]))
    diff = (packed[0, start:end].float() - alone[0].float()).abs().max().item()
    if diff > TOLERANCE:
        config = getattr(model, "config", None)
        hint = (
            "it builds a key/value cache (config.use_cache=True), and transformers derives the "
            "per-example mask from position_ids only without one: set model.config.use_cache = False"
            if getattr(config, "use_cache", False)
            else "it does not turn position_ids into a per-example mask (transformers 5 models do, "
            "with eager or sdpa attention and use_cache=False): use such a model"
        )
        raise ConfigError(
            f"{type(model).__name__} lets packed examples attend to each other (an example's logits "
            f"differ by {diff:.3g} packed and alone): {hint}, or tokenize with packing=False."
        )


def _second_example(positions: Any) -> tuple[int, int, int] | None:
    """(row, start, end) of the second example of the first row holding two."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2:
        return None
    for row, pos in enumerate(positions):
        starts = (pos[1:] == 0).nonzero().flatten() + 1
        if len(starts):
            start = int(starts[0])
            end = int(starts[1]) if len(starts) > 1 else len(pos)
            return row, start, end
    return None


def _logits(out: Any) -> torch.Tensor:
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, Mapping):
        logits = out.get("logits")
    return logits if isinstance(logits, torch.Tensor) else out


class _evaluating:
    """The model in eval mode (no dropout) for the comparison, then as it was."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was)


__all__ = ["check_packing"]
