"""State dicts as safetensors bytes/files: no pickle anywhere a model travels or is stored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import load_file, save_file
from safetensors.torch import save as st_save

from ..files import atomic_write


def _plain(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared storage (tied weights); independent contiguous copies are fine
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in state.items()}


def state_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    return st_save(_plain(state))


def state_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    return st_load(data)


def save_state(state: Mapping[str, torch.Tensor], path: str | Path, metadata: Mapping[str, Any] | None = None) -> Path:
    """Write a state dict as safetensors (+ a JSON sidecar of metadata), atomically."""
    path = Path(path)
    atomic_write(path, lambda tmp: save_file(_plain(state), tmp))
    if metadata is not None:
        atomic_write(path.with_suffix(".json"),
                     lambda tmp: Path(tmp).write_text(json.dumps(dict(metadata), indent=2, default=str)))
    return path


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
