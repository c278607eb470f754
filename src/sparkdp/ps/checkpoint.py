"""Atomic, pickle-free checkpoints of the parameter server.

One ``.safetensors`` file: every tensor of the state (centre, rule state) is a
safetensors entry; the nesting around them (versions, per-worker counters, rule
hyper-state) is JSON stored in the file's metadata (``sparkdp.state``, the one pickle-free
state format).  Loading therefore never runs an unpickler.  One file means one ``os.replace``: a crash mid-save
leaves the previous checkpoint intact (the temporary file is removed on error).
"""

from __future__ import annotations

import os
from typing import Any

from safetensors import safe_open
from safetensors.torch import save_file

from sparkdp.files import atomic_write
from sparkdp.state import META_KEY, flatten, unflatten


def save_state(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` to ``path`` atomically (:func:`sparkdp.files.atomic_write`)."""
    skeleton, tensors = flatten(state)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={META_KEY: skeleton}), make_dirs=False)


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by :func:`save_state`."""
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if META_KEY not in meta:
            raise ValueError(f"{path} is a safetensors file but not a sparkdp parameter-server checkpoint.")
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    return unflatten(meta[META_KEY], tensors)
