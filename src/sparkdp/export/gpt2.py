"""The built-in ``gpt`` (sparkdp.models.gpt) as a Hugging Face GPT-2 (``GPT2LMHeadModel``).

The two are the same architecture: learned token and position embeddings, pre-norm blocks
(LayerNorm eps 1e-5, causal attention scaled by 1/sqrt(head size), a 4x GELU MLP), a final
LayerNorm and a head tied to the token embedding. What differs is naming and layout: GPT-2 keeps
its projections in ``Conv1D`` modules, whose weight is the transpose of ``nn.Linear``'s, and the
built-in MLP uses the exact GELU (GPT-2's ``activation_function="gelu"``, not its default
tanh approximation ``"gelu_new"``). The tied head is not written; GPT-2 ties it on load.

One behaviour is the model's, not its weights': the built-in model numbers positions 0..T-1 in
every row, while Hugging Face's ``generate`` numbers a left-padded row from its first real token.
Unpadded inputs give the same logits either way.
"""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from ..errors import ConfigError

#: built-in name pattern -> (GPT-2 name, whether the tensor is a Linear weight GPT-2 keeps transposed)
_RULES: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(pattern), target, transpose)
    for pattern, target, transpose in (
        (r"^wte\.weight$", "transformer.wte.weight", False),
        (r"^wpe\.weight$", "transformer.wpe.weight", False),
        (r"^ln_f\.(weight|bias)$", r"transformer.ln_f.\1", False),
        (r"^blocks\.(\d+)\.(ln_1|ln_2)\.(weight|bias)$", r"transformer.h.\1.\2.\3", False),
        (r"^blocks\.(\d+)\.attn\.qkv\.weight$", r"transformer.h.\1.attn.c_attn.weight", True),
        (r"^blocks\.(\d+)\.attn\.qkv\.bias$", r"transformer.h.\1.attn.c_attn.bias", False),
        (r"^blocks\.(\d+)\.attn\.proj\.weight$", r"transformer.h.\1.attn.c_proj.weight", True),
        (r"^blocks\.(\d+)\.attn\.proj\.bias$", r"transformer.h.\1.attn.c_proj.bias", False),
        (r"^blocks\.(\d+)\.mlp\.fc\.weight$", r"transformer.h.\1.mlp.c_fc.weight", True),
        (r"^blocks\.(\d+)\.mlp\.fc\.bias$", r"transformer.h.\1.mlp.c_fc.bias", False),
        (r"^blocks\.(\d+)\.mlp\.proj\.weight$", r"transformer.h.\1.mlp.c_proj.weight", True),
        (r"^blocks\.(\d+)\.mlp\.proj\.bias$", r"transformer.h.\1.mlp.c_proj.bias", False),
    )
)
_TIED_HEAD = "lm_head.weight"


def gpt2_config_kwargs(arguments: dict[str, Any], eos_token_id: int | None = None) -> dict[str, Any]:
    """``GPT2Config``'s keywords for a built-in gpt built with ``arguments``."""
    dropout = float(arguments.get("dropout", 0.0))
    return {
        "vocab_size": int(arguments["vocab_size"]),
        "n_positions": int(arguments["block_size"]),
        "n_embd": int(arguments["d_model"]),
        "n_layer": int(arguments["n_layer"]),
        "n_head": int(arguments["n_head"]),
        "n_inner": None,  # 4 * n_embd, as the built-in MLP
        "activation_function": "gelu",  # the built-in MLP's exact GELU
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
        "layer_norm_epsilon": 1e-5,  # nn.LayerNorm's default, which the built-in blocks use
        "tie_word_embeddings": True,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "architectures": ["GPT2LMHeadModel"],
    }


def gpt2_state(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A built-in gpt's state dict under GPT-2's names and layout (transposed views, no copies).

    Raises:
        ConfigError: an entry has no GPT-2 counterpart (a model derived from the built-in one
            with parts GPT-2 lacks), or a GPT-2 weight is missing.
    """
    out: dict[str, Tensor] = {}
    unknown = []
    for name, tensor in state.items():
        if name == _TIED_HEAD:
            continue  # the token embedding itself; GPT-2 ties its head to it on load
        for pattern, target, transpose in _RULES:
            if pattern.match(name):
                out[pattern.sub(target, name)] = tensor.t() if transpose else tensor
                break
        else:
            unknown.append(name)
    if unknown:
        raise ConfigError(
            f"this model has entries GPT-2 has no place for ({', '.join(unknown[:5])}); only the "
            "built-in gpt's own layers export as GPT-2. Export the model's state with "
            "TrainResult.save instead."
        )
    blocks = {int(n.split(".")[2]) for n in out if n.startswith("transformer.h.")}
    expected = 2 + 2 + 12 * len(blocks)  # embeddings, ln_f, and 12 tensors per block
    if len(out) != expected or "transformer.wte.weight" not in out:
        raise ConfigError(
            f"the state holds {len(out)} of GPT-2's {expected} tensors for {len(blocks)} blocks; "
            "export the whole model, not a part of it."
        )
    return out


__all__ = ["gpt2_config_kwargs", "gpt2_state"]
