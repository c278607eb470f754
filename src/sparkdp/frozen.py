"""Models with a frozen part: adapters (LoRA, ``peft.get_peft_model``) trained on a pretrained
base whose parameters have ``requires_grad=False``.

The base never changes and every worker already holds it (it travels with the model, or each
worker loads it from the same directory), so what a job moves and keeps is the trainable part
only: the strategies communicate trainable parameters, and checkpoints and ``fit``'s result hold
every state-dict entry except the frozen parameters (the adapters and the buffers). Loading such
a state back needs the same base: :func:`load_model_state` checks that exactly the frozen
parameters are missing.

Under ``precision="bf16-mixed"`` the frozen base is stored in bfloat16 on the workers
(:func:`store_frozen_in`: half the memory, and what a sharding strategy all-gathers), while the
trainable parameters, their gradients and the optimizer state stay float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .errors import ConfigError


def frozen_names(model: nn.Module) -> set[str]:
    """State-dict names of ``model``'s frozen parameters (tied ones under every name they have),
    or an empty set when every parameter trains (or none does: nothing would be kept)."""
    named = list(model.named_parameters(remove_duplicate=False))
    frozen = {name for name, p in named if not p.requires_grad}
    return frozen if len(frozen) < len(named) else set()


def trainable_state(model: nn.Module, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` (``model``'s state dict, or this rank's share of it) less the frozen parameters."""
    frozen = frozen_names(model)
    return {k: v for k, v in state.items() if k not in frozen}


def expected_keys(model: nn.Module, saved: Any) -> set[str]:
    """The names a saved state of ``model`` holds: all of its state dict, or all but the frozen
    parameters when ``saved`` (names) leaves them out."""
    whole = set(model.state_dict())
    frozen = frozen_names(model)
    return whole - frozen if frozen and not (set(saved) & frozen) else whole


def load_model_state(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load a whole state dict, or a trainable-only one (:func:`trainable_state`) into a model
    holding the same frozen base; anything else is refused with the names that differ."""
    want = expected_keys(model, state)
    if set(state) != want:
        missing, extra = sorted(want - set(state)), sorted(set(state) - want)
        raise ConfigError(
            f"the saved state does not fit {type(model).__name__} (missing: {', '.join(missing[:5]) or 'none'}; "
            f"not in the model: {', '.join(extra[:5]) or 'none'}). Load it into the model it was "
            "trained from (the same base and adapters)."
        )
    model.load_state_dict(dict(state), strict=want == set(model.state_dict()))


def base_identity(model: nn.Module) -> dict[str, Any]:
    """What a trainable-only state needs beside it to be loaded again: the frozen base's source
    (a PEFT model's ``base_model_name_or_path``, a Hugging Face model's ``name_or_path``), how
    many parameters it holds, and the adapter's kind; empty for a model without a frozen part."""
    frozen = frozen_names(model)
    if not frozen:
        return {}
    configs = getattr(model, "peft_config", None) or {}
    adapter = next(iter(configs.values()), None)
    source = getattr(adapter, "base_model_name_or_path", None) or getattr(model, "name_or_path", None)
    kind = getattr(adapter, "peft_type", None)
    return {
        "base_model": str(source) if source else None,
        "adapter": str(getattr(kind, "value", kind)) if kind is not None else None,
        "frozen_parameters": len(frozen),
    }


def store_frozen_in(model: nn.Module, dtype: torch.dtype) -> int:
    """Store ``model``'s frozen floating parameters in ``dtype`` (in place; tied ones once);
    returns how many bytes that saved. Trainable parameters keep their dtype."""
    if not frozen_names(model):
        return 0
    saved = 0
    for p in model.parameters():  # each parameter once, tied ones included
        if not p.requires_grad and p.is_floating_point() and p.dtype != dtype:
            saved += p.numel() * (p.element_size() - torch.empty((), dtype=dtype).element_size())
            p.data = p.data.to(dtype)
    return saved


__all__ = [
    "base_identity",
    "expected_keys",
    "frozen_names",
    "load_model_state",
    "store_frozen_in",
    "trainable_state",
]
