"""State as safetensors bytes or files, never pickle: reading one never runs an unpickler.

A model's state dict is plain safetensors (:func:`state_to_bytes`, :func:`save_state`), which
any safetensors reader loads; a sharded model comes back from its workers as parts of one
(:func:`part_to_bytes`), each a slice of the same safetensors kind, joined on the driver
(:func:`join_parts`). Nested state (dicts, lists, tuples, numbers, strings, None,
tensors) keeps its tensors as safetensors entries and the nesting around them as JSON in the
safetensors metadata under ``"sparkdp"`` (:func:`to_bytes`, :func:`save`). Used for optimizer
state between stages (``train.loop``, as bytes) and the contents of every checkpoint
(``train.checkpoint_store``).

Example:
    >>> import torch
    >>> back = from_bytes(to_bytes({0: {"momentum": torch.ones(2)}, "lr": (0.1, None)}))
    >>> back[0]["momentum"], back["lr"]
    (tensor([1., 1.]), (0.1, None))
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as _st_load
from safetensors.torch import load_file, save_file
from safetensors.torch import save as _st_save
from torch import Tensor

from .files import atomic_write

_RESERVED = ("__tensor__", "__items__", "__tuple__")
META_KEY = "sparkdp"
#: the safetensors metadata key of a worker's part of a model's state (:func:`part_to_bytes`)
PART_KEY = "sparkdp-part"
#: the deepest a skeleton may nest (JSON levels): beyond any state sparkdp writes (an optimizer's
#: is 6 deep; a task result nested the 64 levels it may be takes up to 195) and well inside Python's
#: recursion limit (two frames a level), so a deeper one is refused as damage by this check
MAX_DEPTH = 320


def _plain(tensor: Tensor, seen: set[int]) -> Tensor:
    """``tensor`` as safetensors takes it: on the CPU, contiguous, and sharing no storage with the
    tensors taken before it (``seen``: their storages' addresses; tied weights, views of one
    buffer). It is copied only where one of these needs it: copying every tensor held a second
    whole state while a large one was encoded. safetensors only reads what it is given."""
    plain = tensor.detach().to("cpu").contiguous()
    storage = plain.untyped_storage().data_ptr()
    if storage and storage in seen:
        plain = plain.clone()
    seen.add(plain.untyped_storage().data_ptr())
    return plain


def _plain_all(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    seen: set[int] = set()
    return {k: _plain(v, seen) for k, v in state.items()}


def state_to_bytes(state: Mapping[str, Tensor]) -> bytes:
    """A model's state dict as plain safetensors bytes."""
    return _st_save(_plain_all(state))


def state_from_bytes(data: bytes) -> dict[str, Tensor]:
    return _st_load(data)


def part_to_bytes(state: Mapping[str, Tensor], pieces: Mapping[str, tuple[int, int, int]]) -> bytes:
    """One worker's part of a model's state dict as safetensors bytes, for :func:`join_parts`.

    ``pieces[name] = (index, count, rows)``: the entry is slice ``index`` of ``count`` consecutive
    slices along dim 0 of the whole tensor, which has ``rows`` rows (a sharding strategy's shard);
    an entry not in ``pieces`` is whole. The metadata keeps the entries' order, which safetensors
    does not.
    """
    layout = json.dumps({name: list(pieces[name]) if name in pieces else None for name in state})
    return _st_save(_plain_all(state), metadata={PART_KEY: layout})


def join_parts(parts: Sequence[bytes]) -> dict[str, Tensor]:
    """The whole state dict from every worker's part (:func:`part_to_bytes`; plain
    :func:`state_to_bytes` bytes count as one whole part): slices joined along dim 0 in index
    order, whole entries from the first part that has them, names in the order the parts give.
    It allocates the joined tensors and nothing that a part only declares: a slice count is
    checked against the number of parts (each part holds one slice of an entry at most).

    Raises:
        ValueError: a part is not one; a slice is missing or given twice; an entry is cut into
            more slices than there are parts, or parts disagree on its slice count or rows; its
            slices differ in dtype or in a dimension but the first, or their rows do not add up
            to the rows declared; an entry is both whole and sliced.
    """
    whole: dict[str, Tensor] = {}
    slices = _Slices(len(parts))
    order: dict[str, None] = {}
    for data in parts:
        tensors = _part_tensors(data)
        for name, where in _layout(data, tensors).items():
            order.setdefault(name)
            if where is None:
                whole.setdefault(name, tensors[name])
            else:
                slices.add(name, where, tensors[name])
    both = sorted(whole.keys() & slices.names())
    if both:
        raise ValueError(f"{both} are both whole and sliced in the parts")
    return {name: whole[name] if name in whole else slices.joined(name) for name in order}


class _Slices:
    """The sliced entries of a model's parts, each slice checked as it arrives against what the
    parts declare (:func:`join_parts`)."""

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.declared: dict[str, tuple[int, int]] = {}  # name -> (slice count, rows of the whole)
        self.pieces: dict[str, dict[int, Tensor]] = {}

    def names(self) -> set[str]:
        return set(self.pieces)

    def add(self, name: str, where: tuple[int, int, int], tensor: Tensor) -> None:
        index, count, rows = where
        if not 0 < count <= self.parts:
            raise ValueError(
                f"{name!r} is cut into {count} slices, but {self.parts} part(s) were given: an entry "
                "has at least one slice and each part holds one slice of it at most"
            )
        if self.declared.setdefault(name, (count, rows)) != (count, rows):
            (had, had_rows) = self.declared[name]
            raise ValueError(
                f"the parts disagree on {name!r}: it is cut into {had} and {count} slices "
                f"of a tensor of {had_rows} and {rows} rows"
            )
        pieces = self.pieces.setdefault(name, {})
        if index in pieces or not 0 <= index < count:
            raise ValueError(f"slice {index} of {count} of {name!r} is given twice or out of range")
        other = next(iter(pieces.values()), None)
        if tensor.dim() == 0 or (
            other is not None and (tensor.dtype, tensor.shape[1:]) != (other.dtype, other.shape[1:])
        ):
            seen = "" if other is None else f", another is {other.dtype} {tuple(other.shape)}"
            raise ValueError(
                f"slice {index} of {name!r} is {tensor.dtype} {tuple(tensor.shape)}{seen}: the slices "
                "of an entry have one dtype and the same dimensions but the first, along which they join"
            )
        pieces[index] = tensor

    def joined(self, name: str) -> Tensor:
        (count, rows), pieces = self.declared[name], self.pieces[name]
        missing = [i for i in range(count) if i not in pieces]  # count <= the parts: bounded
        if missing:
            raise ValueError(f"slices {missing} of {count} of {name!r} are missing from the parts")
        held = sum(piece.shape[0] for piece in pieces.values())
        if held != rows:
            raise ValueError(f"the slices of {name!r} hold {held} rows, not the {rows} its parts declare")
        return torch.cat([pieces[i] for i in range(count)])


def _part_tensors(data: bytes) -> dict[str, Tensor]:
    try:
        return _st_load(bytes(data))
    except SafetensorError as err:
        raise ValueError(f"a part of the model's state is not safetensors ({err})") from None


def _metadata(data: bytes) -> dict[str, str]:
    """The metadata of safetensors bytes that :func:`_st_load` has already read (so the header is
    known to be well formed)."""
    (size,) = struct.unpack("<Q", data[:8])  # safetensors: u64 header size, then the JSON header
    return json.loads(data[8 : 8 + size]).get("__metadata__") or {}


def _layout(data: bytes, tensors: Mapping[str, Tensor]) -> dict[str, tuple[int, int, int] | None]:
    """Each entry of a part and the slice it is (None: whole), in the part's order
    (:func:`part_to_bytes`); plain state bytes are all whole."""
    metadata = _metadata(data)
    if PART_KEY not in metadata:
        return dict.fromkeys(tensors)
    try:
        listed = json.loads(metadata[PART_KEY])
        layout = {name: None if where is None else _where(where) for name, where in listed.items()}
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"a part's {PART_KEY!r} metadata is damaged ({type(err).__name__}: {err})") from None
    if layout.keys() != tensors.keys():
        raise ValueError(f"a part's {PART_KEY!r} metadata does not list the tensors it holds")
    return layout


def _where(where: Any) -> tuple[int, int, int]:
    """A sliced entry's ``[index, count, rows]`` as written by :func:`part_to_bytes`."""
    if not (
        isinstance(where, list)
        and len(where) == 3
        and all(type(n) is int for n in where)  # JSON's true is no count
    ):
        raise ValueError(f"a slice is [index, count, rows], not {where!r}")
    return where[0], where[1], where[2]


def save_state(
    state: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write a state dict as plain safetensors (+ a JSON sidecar of metadata), atomically."""
    path = Path(path)
    atomic_write(path, lambda tmp: save_file(_plain_all(state), tmp))
    if metadata is not None:
        atomic_write(
            path.with_suffix(".json"),
            lambda tmp: Path(tmp).write_text(json.dumps(dict(metadata), indent=2, default=str)),
        )
    return path


def load_state(path: str | Path) -> dict[str, Tensor]:
    return load_file(str(path))


def flatten(obj: Any, where: str = "state") -> tuple[str, dict[str, Tensor]]:
    """``obj`` as a JSON skeleton plus the tensors it references, as safetensors takes them (on
    the CPU, contiguous, no two sharing storage; :func:`_plain` copies only where needed, so the
    tensors may be ``obj``'s own: write them out before ``obj`` changes)."""
    tensors: dict[str, Tensor] = {}
    return json.dumps(_encode(obj, tensors, where, set())), tensors


def unflatten(skeleton: str, tensors: dict[str, Tensor]) -> Any:
    """The inverse of :func:`flatten`.

    Raises:
        ValueError: the skeleton names a tensor that is not stored or names one twice
            (:func:`flatten` names each tensor once, so a value built back never holds more
            than the stored tensors), or is nested deeper than :data:`MAX_DEPTH`.
    """
    return _Decoder(tensors).decode(json.loads(skeleton), 0)


def to_bytes(obj: Any) -> bytes:
    skeleton, tensors = flatten(obj)
    return _st_save(tensors, metadata={META_KEY: skeleton})


def from_bytes(data: bytes) -> Any:
    """The value :func:`to_bytes` encoded.

    Raises:
        ValueError: ``data`` is not sparkdp state, or is truncated or damaged.
    """
    data = bytes(data)
    try:
        # first, so that everything read below comes from a header safetensors has checked
        # (a JSON object, string metadata, tensor byte ranges inside the data)
        tensors = _st_load(data)
    except SafetensorError as err:
        raise ValueError(
            f"these bytes are not sparkdp state: they do not read as safetensors ({err}). "
            "Are they truncated or damaged?"
        ) from err
    metadata = _metadata(data)
    if META_KEY not in metadata:
        raise ValueError("these bytes are safetensors but not sparkdp state (no 'sparkdp' metadata).")
    try:
        return unflatten(metadata[META_KEY], tensors)
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        # the skeleton is JSON of our own shape; anything else means the bytes were damaged
        raise ValueError(
            f"these bytes hold damaged sparkdp state: its 'sparkdp' metadata does not describe "
            f"the stored values ({type(err).__name__}: {err})."
        ) from err


def save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` to ``path`` atomically (:func:`sparkdp.files.atomic_write`)."""
    skeleton, tensors = flatten(obj)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={META_KEY: skeleton}), make_dirs=False)


def load(path: str | os.PathLike[str]) -> Any:
    """Read a file written by :func:`save`; ``ValueError`` if it is damaged or not one, ``OSError``
    if it cannot be opened."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if META_KEY not in meta:
                raise ValueError(
                    f"{path} is a safetensors file but not sparkdp state (no 'sparkdp' metadata)."
                )
            return unflatten(meta[META_KEY], {k: fh.get_tensor(k) for k in fh.keys()})
    except (OSError, ValueError):
        raise
    except Exception as exc:  # safetensors raises its own error type (not a ValueError) for a damaged file
        raise ValueError(
            f"{path} is not a readable sparkdp state file ({type(exc).__name__}: {exc})."
        ) from exc


def _encode(obj: Any, tensors: dict[str, Tensor], where: str, seen: set[int]) -> Any:
    if isinstance(obj, Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = _plain(obj, seen)
        return {"__tensor__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _RESERVED for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}", seen) for k, v in obj.items()}
        # int keys (per-worker or per-parameter state) would silently become strings in JSON
        return {
            "__items__": [
                [_encode(k, tensors, where, seen), _encode(v, tensors, f"{where}[{k!r}]", seen)]
                for k, v in obj.items()
            ]
        }
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]", seen) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]", seen) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(
        f"state value at {where} has type {type(obj).__name__}; a state_dict may hold only tensors, "
        "numbers, strings, None and lists/tuples/dicts of them."
    )


class _Decoder:
    """Builds a skeleton back around its tensors, each stored tensor used at most once: a
    skeleton that named one tensor many times would make every reader that copies the values
    (a task result's bytes, a state dict loaded into a model) allocate that tensor each time."""

    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        self.tensors = tensors
        self.used: set[str] = set()

    def tensor(self, name: Any) -> Tensor:
        if name in self.used:
            raise ValueError(
                f"the skeleton names tensor {name!r} twice; sparkdp state stores each tensor once"
            )
        if not isinstance(name, str) or name not in self.tensors:
            raise ValueError(f"the skeleton names tensor {name!r}, which is not stored")
        self.used.add(name)
        return self.tensors[name]

    def decode(self, obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"the skeleton is nested more than {MAX_DEPTH} levels deep")
        deeper = depth + 1
        if isinstance(obj, list):
            return [self.decode(v, deeper) for v in obj]
        if isinstance(obj, dict):
            if "__tensor__" in obj:
                return self.tensor(obj["__tensor__"])
            if "__items__" in obj:
                return {self.decode(k, deeper): self.decode(v, deeper) for k, v in obj["__items__"]}
            if "__tuple__" in obj:
                return tuple(self.decode(v, deeper) for v in obj["__tuple__"])
            return {k: self.decode(v, deeper) for k, v in obj.items()}
        return obj
