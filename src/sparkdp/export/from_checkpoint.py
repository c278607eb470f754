"""``sparkdp export``: a job's newest checkpoint as a Hugging Face directory.

The checkpoint names its model (:mod:`sparkdp.export.record`, saved with every checkpoint);
the driver builds that model once, fills it from the checkpoint and writes it with
:func:`sparkdp.export.pretrained.save_pretrained`. A sharded (``fsdp``/``hsdp``) checkpoint is
read rank file by rank file, each checked against the manifest as it is read, and
``torch.distributed.checkpoint`` copies each tensor's pieces into the model's own tensor: no
second copy of the model is made, and no training rank is involved.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..frozen import frozen_names, load_model_state
from ..train.checkpoint import Checkpoint, check_compatible, latest_checkpoint
from ..train.checkpoint_manager import CheckpointManager
from ..train.sharded_checkpoint import aliases, copy_parts
from .pretrained import DEFAULT_MAX_SHARD_SIZE, save_pretrained
from .record import PEFT, build_model


def export_checkpoint(
    directory: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    tokenizer: Any = None,
    merge_adapters: bool = False,
    hf_config: str | os.PathLike[str] | None = None,
    base: str | os.PathLike[str] | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write the newest checkpoint in ``directory`` that reads and verifies to ``out``.

    ``hf_config``: a Hugging Face ``config.json`` (or a directory holding one) for a checkpoint
    that does not record its model; it builds ``AutoModelForCausalLM.from_config``.
    ``base``: the local Hugging Face directory a PEFT model was fine-tuned from. Its checkpoints
    hold the adapters only (:mod:`sparkdp.frozen`): the adapter is exported without it, but
    merging needs the base's weights.

    Raises:
        ConfigError: no checkpoint, no model to rebuild, or weights that do not fit it.
    """
    if not Path(directory).is_dir() and "://" not in os.fspath(directory):
        raise ConfigError(f"checkpoint directory {directory} does not exist; give a job's checkpoint_dir.")
    checkpoint = latest_checkpoint(directory)
    if checkpoint is None:
        raise ConfigError(
            f"{directory} holds no synchronous checkpoint that reads and verifies (ckpt-* or "
            "shards-*); give the checkpoint_dir of an allreduce, average, diloco, zero1, fsdp or "
            "hsdp job."
        )
    model = _on_base(checkpoint, Path(base)) if base is not None else _model_for(checkpoint, hf_config)
    if checkpoint.shards:
        saved = load_shards(checkpoint.shards, model)
    else:
        check_compatible(model, checkpoint)
        load_model_state(model, checkpoint.model)
        saved = set(checkpoint.model)
    if merge_adapters and base is None and frozen_names(model) - saved:
        raise ConfigError(
            f"the checkpoint {checkpoint.path} holds the adapters only, without the frozen base "
            "they were trained on, so they cannot be merged into it; give the base model's "
            "directory (--base DIR), or export the adapter (leave out --merge-adapters)."
        )
    return save_pretrained(
        model, out, tokenizer=tokenizer, merge_adapters=merge_adapters, max_shard_size=max_shard_size
    )


def _model_for(checkpoint: Checkpoint, hf_config: str | os.PathLike[str] | None) -> nn.Module:
    if hf_config is not None:
        return _from_hf_config(Path(hf_config))
    if checkpoint.model_record is None:
        raise ConfigError(
            f"the checkpoint {checkpoint.path} does not say which model it holds (it was written "
            "before checkpoints recorded their model, or by a model sparkdp cannot rebuild); pass "
            "the model's Hugging Face config with --hf-config."
        )
    return build_model(checkpoint.model_record)


def _from_hf_config(path: Path) -> nn.Module:
    import transformers

    file = path / "config.json" if path.is_dir() else path
    try:
        settings = json.loads(file.read_text())
        config = transformers.AutoConfig.for_model(
            settings.pop("model_type"), **{k: v for k, v in settings.items() if k != "transformers_version"}
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"--hf-config {path}: not a readable Hugging Face config.json ({type(err).__name__}: {err}); "
            "give the config.json of the model the checkpoint was trained from."
        ) from None
    return transformers.AutoModelForCausalLM.from_config(config)


def _on_base(checkpoint: Checkpoint, directory: Path) -> nn.Module:
    """The checkpoint's PEFT model with its frozen base read from the Hugging Face ``directory``
    it was fine-tuned from (safetensors only, nothing downloaded)."""
    record = checkpoint.model_record
    if (
        not isinstance(record, dict)
        or record.get("type") != PEFT
        or not isinstance(record.get("adapter"), dict)
    ):
        raise ConfigError(
            f"--base is for a PEFT model's checkpoint; {checkpoint.path} records no PEFT model. "
            "Leave out --base."
        )
    import peft

    from ..models.hf import load_hf_model

    pretrained = load_hf_model(directory, setting="--base", training=False)
    return peft.get_peft_model(pretrained, peft.PeftConfig.from_peft_type(**record["adapter"]))


def load_shards(location: str, model: nn.Module) -> set[str]:
    """Fill ``model`` from the sharded checkpoint whose manifest is at ``location``; the names
    it held (a PEFT model's checkpoint holds its trainable parameters only)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    where, _, name = location.rstrip("/").rpartition("/")
    store = CheckpointManager.reader(where).store
    manifest = store.manifest(name)
    state = model.state_dict()
    tied = {k: v for k, v in aliases(model).items() if v in state}
    frozen = frozen_names(model)  # not in the checkpoint (sparkdp.frozen)
    weights = {k: v for k, v in state.items() if k not in tied and k not in frozen}
    with tempfile.TemporaryDirectory(prefix="sparkdp-export-") as tmp:
        copy_parts(store, name, manifest, tmp)  # one rank's file at a time, each checked
        try:
            with warnings.catch_warnings():  # one process reads every rank's file: DCP warns of it
                warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable")
                dcp.load({"model": weights}, storage_reader=HuggingFaceStorageReader(tmp), no_dist=True)
        except Exception as exc:  # DCP names the missing or mismatched tensor
            raise ConfigError(
                f"the sharded checkpoint {location} does not fit the model it records ({exc}); "
                "pass the config of the model it was trained from with --hf-config."
            ) from exc
    loaded = {**weights, **{alias: weights[first] for alias, first in tied.items() if first in weights}}
    model.load_state_dict(loaded, strict=not frozen)
    return set(loaded)


__all__ = ["export_checkpoint", "load_shards"]
