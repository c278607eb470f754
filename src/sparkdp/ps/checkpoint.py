"""Atomic, pickle-free checkpoints of the parameter server.

One ``.safetensors`` file: every tensor of the state (centre, rule state) is a
safetensors entry; the nesting around them (versions, per-worker counters, rule
hyper-state) is JSON stored in the file's metadata under ``"sparkdp"``.  Loading
therefore never runs an unpickler.  One file means one ``os.replace``: a crash mid-save
leaves the previous checkpoint intact (the temporary file is removed on error).
"""

from __future__ import annotations

import json
import os
from typing import Any

from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from sparkdp.files import atomic_write

_RESERVED = ("__tensor__", "__items__", "__tuple__")


def _encode(obj: Any, tensors: dict[str, Tensor], where: str) -> Any:
    if isinstance(obj, Tensor):
        name = f"t{len(tensors)}"
        # clone: safetensors refuses tensors that share storage (views of the centre)
        tensors[name] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _RESERVED for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        # int keys (e.g. per-worker state) would silently become strings in JSON
        return {
            "__items__": [
                [_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()
            ]
        }
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"checkpoint value at {where} has type {type(obj).__name__}; a state_dict may hold only tensors, "
        "numbers, strings, None and lists/tuples/dicts of them."
    )


def _decode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__items__" in obj:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        return {k: _decode(v, tensors) for k, v in obj.items()}
    return obj


def save_state(state: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``state`` to ``path`` atomically (:func:`sparkdp.files.atomic_write`)."""
    tensors: dict[str, Tensor] = {}
    skeleton = json.dumps(_encode(state, tensors, "state"))
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"sparkdp": skeleton}), make_dirs=False)


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by :func:`save_state`."""
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if "sparkdp" not in meta:
            raise ValueError(f"{path} is a safetensors file but not a sparkdp parameter-server checkpoint.")
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    return _decode(json.loads(meta["sparkdp"]), tensors)
