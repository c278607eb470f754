"""A trained model written as a Hugging Face directory: what ``from_pretrained`` opens.

- A Hugging Face model: its own ``save_pretrained`` (``config.json``, safetensors, sharded with
  an index above ``max_shard_size``).
- A PEFT model: the adapter (``adapter_config.json``, ``adapter_model.safetensors``) by PEFT's
  own ``save_pretrained``, or with ``merge_adapters`` the base model with the adapters merged
  into it (a copy is merged; the model passed in keeps its adapters).
- The built-in ``gpt``: a GPT-2 (sparkdp.export.gpt2), its tensors planned into files by
  ``huggingface_hub``'s ``split_torch_state_dict_into_shards`` and written one file at a time.

With a tokenizer, its files go beside the model (a ``tokenizers.Tokenizer`` wrapped in
``PreTrainedTokenizerFast``). The whole directory is written under a temporary name beside
the target and renamed into place at the end: a failure leaves no directory at the target.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..errors import ConfigError
from ..models.gpt import GPT
from .gpt2 import gpt2_config_kwargs, gpt2_state
from .record import PEFT, TRANSFORMERS, model_record

DEFAULT_MAX_SHARD_SIZE = "5GB"
#: what a language model's tokenizer returns: GPT-2 embeds token_type_ids when it gets them, so a
#: tokenizer that returns them (PreTrainedTokenizerFast's default) spoils its generation
LM_INPUT_NAMES = ["input_ids", "attention_mask"]
EOS_TOKEN = "<|endoftext|>"  # the end-of-document token of sparkdp's tokenizers (data/text.py)


def save_pretrained(
    model: nn.Module,
    path: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    merge_adapters: bool = False,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write ``model`` (and ``tokenizer``) to the new directory ``path`` (module docstring).

    Raises:
        ConfigError: ``path`` exists and is not an empty directory, the model is of no kind
            Hugging Face opens, or the tokenizer is not one.
    """
    target = Path(path)
    _check_target(target)
    record = model_record(model)
    if record is None:
        raise ConfigError(
            f"a {type(model).__name__} has no Hugging Face format; save_pretrained writes the "
            "built-in gpt, Hugging Face transformers models and PEFT-wrapped ones. Save this "
            "model's state dict with TrainResult.save instead."
        )
    if merge_adapters and record["type"] != PEFT:
        raise ConfigError("merge_adapters applies to PEFT models only; this model has no adapters to merge.")
    hf_tokenizer = _hf_tokenizer(tokenizer, keep_token_type_ids=_uses_token_types(record))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        _write_model(model, record, staging, merge_adapters, max_shard_size, hf_tokenizer)
        if hf_tokenizer is not None:
            hf_tokenizer.save_pretrained(staging)
        staging.chmod(0o777 & ~_umask())  # mkdtemp's 0700, as a directory made by mkdir would be
        if target.exists():
            target.rmdir()  # empty (checked above); a file put there since makes this fail, not lose it
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _umask() -> int:
    from ..files import process_umask

    return process_umask()


def _check_target(target: Path) -> None:
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(
            f"{target} already exists and is not an empty directory; save_pretrained writes a new "
            "directory. Choose another path or remove the old one first."
        )


def _write_model(
    model: nn.Module,
    record: dict[str, Any],
    directory: Path,
    merge_adapters: bool,
    max_shard_size: int | str,
    tokenizer: Any,
) -> None:
    if isinstance(model, GPT):
        eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN) if tokenizer is not None else None
        write_gpt2(model.state_dict(), record["arguments"], directory, max_shard_size, eos)
    elif record["type"] == PEFT and merge_adapters:
        merged = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
        merged.save_pretrained(directory, max_shard_size=max_shard_size)
    elif record["type"] == PEFT:
        model.save_pretrained(directory)  # type: ignore[operator]
    else:
        model.save_pretrained(directory, max_shard_size=max_shard_size)  # type: ignore[operator]


def write_gpt2(
    state: dict[str, Tensor],
    arguments: dict[str, Any],
    directory: Path,
    max_shard_size: int | str,
    eos_token_id: int | None = None,
) -> None:
    """A built-in gpt's ``state`` as a GPT-2 checkpoint in ``directory``: ``config.json``,
    ``generation_config.json`` and the weights (:func:`write_safetensors`)."""
    from transformers import GenerationConfig, GPT2Config

    write_safetensors(gpt2_state(state), directory, max_shard_size)
    config = GPT2Config(**gpt2_config_kwargs(arguments, eos_token_id))
    config.save_pretrained(directory)
    GenerationConfig.from_model_config(config).save_pretrained(directory)


def write_safetensors(tensors: dict[str, Tensor], directory: Path, max_shard_size: int | str) -> None:
    """``tensors`` as ``model.safetensors``, or above ``max_shard_size`` as numbered files and
    ``model.safetensors.index.json``, as ``save_pretrained`` names them. Files are planned by
    ``huggingface_hub`` and written one at a time: only one file's contiguous copies exist at once."""
    from huggingface_hub import constants, split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    plan = split_torch_state_dict_into_shards(tensors, max_shard_size=max_shard_size)
    for filename, names in plan.filename_to_tensors.items():
        part = {name: tensors[name].detach().to("cpu").contiguous() for name in names}
        save_file(part, str(directory / filename), metadata={"format": "pt"})
        del part
    if plan.is_sharded:
        index = {"metadata": plan.metadata, "weight_map": plan.tensor_to_filename}
        (directory / constants.SAFETENSORS_INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))


def _uses_token_types(record: dict[str, Any]) -> bool:
    """Whether the model was built to take token_type_ids (BERT-like configs have a
    type_vocab_size); language models such as GPT-2 were not."""
    base = record.get("base", record) if record["type"] == PEFT else record
    return base["type"] == TRANSFORMERS and "type_vocab_size" in base.get("config", {})


def _hf_tokenizer(tokenizer: Any, keep_token_type_ids: bool) -> Any:
    """``tokenizer`` as a Hugging Face tokenizer to save: a ``tokenizers.Tokenizer`` wrapped in
    ``PreTrainedTokenizerFast``, an HF tokenizer copied; a path to a ``tokenizer.json`` or a
    tokenizer directory read first. Unless the model takes them, it returns no token_type_ids."""
    if tokenizer is None:
        return None
    import tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

    if isinstance(tokenizer, (str, os.PathLike)):
        where = Path(tokenizer)
        if where.is_dir():
            tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=True)
        elif where.is_file():
            tokenizer = tokenizers.Tokenizer.from_file(str(where))
        else:
            raise ConfigError(
                f"tokenizer {where} does not exist; give a tokenizer.json file or a Hugging Face "
                "tokenizer directory."
            )
    if isinstance(tokenizer, tokenizers.Tokenizer):
        specials = {}
        if tokenizer.token_to_id(EOS_TOKEN) is not None:
            specials = {"eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)
    elif isinstance(tokenizer, PreTrainedTokenizerBase):
        tokenizer = copy.deepcopy(tokenizer)
    else:
        raise ConfigError(
            f"a {type(tokenizer).__name__} is not a tokenizer save_pretrained can write; give a "
            "tokenizers.Tokenizer, a Hugging Face tokenizer, or the path of either."
        )
    if not keep_token_type_ids:
        tokenizer.model_input_names = list(LM_INPUT_NAMES)
        tokenizer.init_kwargs["model_input_names"] = list(LM_INPUT_NAMES)  # what tokenizer_config.json keeps
    return tokenizer


__all__ = ["DEFAULT_MAX_SHARD_SIZE", "save_pretrained", "write_gpt2", "write_safetensors"]
