"""A local Hugging Face model directory as the model to train: ``fit(model="hf:DIR")``,
``sparkdp train --hf-model DIR`` and the job-file key ``hf_model``.

The directory is what ``save_pretrained`` writes: ``config.json`` and the weights. It is opened
with ``AutoModelForCausalLM.from_pretrained`` from local files only, weights as safetensors
only: a ``pytorch_model.bin`` is a pickle, and nothing sparkdp reads from a file is unpickled
(docs/architecture.md, design rule 7). Code the directory ships (``auto_map``) is not run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import nn

from ..config import LoraSettings
from ..errors import ConfigError

#: how ``fit``'s ``model`` names a local Hugging Face directory: ``"hf:path/to/dir"``
HF_PREFIX = "hf:"


def is_hf_source(model: object) -> bool:
    """Whether ``model`` is a string naming a Hugging Face directory (``"hf:DIR"``)."""
    return isinstance(model, str) and model.startswith(HF_PREFIX)


def resolve_model(model: Any) -> nn.Module:
    """``model`` as a module: ``"hf:DIR"`` loaded from its directory; a module as it is."""
    if is_hf_source(model):
        return load_hf_model(model[len(HF_PREFIX) :])
    if isinstance(model, (str, os.PathLike)):
        raise ConfigError(
            f"model={os.fspath(model)!r} is not a model: pass a torch.nn.Module, or 'hf:DIR' for a "
            "local Hugging Face directory (what save_pretrained writes)."
        )
    return model


def load_hf_model(
    directory: str | os.PathLike[str], *, setting: str = "hf_model", training: bool = True
) -> nn.Module:
    """The causal language model saved in ``directory`` (``AutoModelForCausalLM``); opened for
    ``training``, in float32 with ``config.use_cache`` off, else as saved. ``setting``: what the
    errors call the directory (the flag or key the user gave it with).

    Raises:
        ConfigError: no such directory, no ``config.json``, weights only as a pickle (``.bin``),
            or ``transformers`` missing.
    """
    where = Path(directory).expanduser()
    if not (where / "config.json").is_file():
        raise ConfigError(
            f"{setting} {os.fspath(directory)!r} is not a Hugging Face model directory: it has no "
            "config.json. Give the directory save_pretrained wrote."
        )
    names = [p.name for p in where.iterdir()]
    if not any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".ckpt"))]
        raise ConfigError(
            f"{setting} {os.fspath(directory)!r} has no safetensors weights"
            + (f" (only {', '.join(sorted(pickled))}, a pickle sparkdp does not load)" if pickled else "")
            + ". Save it with model.save_pretrained(dir) (safetensors is its default) and give that directory."
        )
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"{setting} needs Hugging Face transformers: pip install 'sparkdp[hf]'.") from None
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(where), local_files_only=True, use_safetensors=True, trust_remote_code=False
        )
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{setting} {os.fspath(directory)!r} cannot be opened as a causal language model: {first}"
        ) from exc
    # training needs no key/value cache, and with one transformers ignores packed rows'
    # position_ids as example boundaries (sparkdp.train.packing): tokenize_examples' packed rows
    # could not train. Generation's own setting (generation_config.use_cache) is left as it is.
    if training:  # float32 weights to train, and no cache
        model.config.use_cache = False
        return model.float()
    return model


def with_lora(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """``model`` wrapped by ``peft.get_peft_model`` with LoRA adapters as ``lora`` says (the
    command line's ``--lora-r``...): the base is frozen and only the adapters train.

    Transformers' ``Conv1D`` layers (GPT-2's) hold their weights transposed, which peft must be
    told (``fan_in_fan_out``); it is set when the model has such layers.

    Raises:
        ConfigError: peft is missing, or no layer of the model matches the target names.
    """
    try:
        import peft
    except ImportError:
        raise ConfigError("--lora-r needs Hugging Face peft: pip install 'sparkdp[hf]'.") from None
    if lora.lora_r is None:
        raise ConfigError("LoRA adapters need their rank: give --lora-r (job-file key lora_r).")
    transposed = any(type(m).__name__ == "Conv1D" for m in model.modules())
    config = peft.LoraConfig(
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha if lora.lora_alpha is not None else lora.lora_r,
        lora_dropout=lora.lora_dropout,
        target_modules=lora.target_modules,
        fan_in_fan_out=transposed,
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as exc:  # peft names the targets it did not find, or that it has no default
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"LoRA adapters cannot be placed on {type(model).__name__}: {first} Name the layers to "
            "adapt with --lora-target-modules (e.g. c_attn,c_fc for GPT-2)."
        ) from None


__all__ = ["HF_PREFIX", "is_hf_source", "load_hf_model", "resolve_model", "with_lora"]
