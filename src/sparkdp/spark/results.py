"""What a Spark task hands back to the driver, as data: never a pickle.

Every sparkdp stage returns one result per task (a worker's :class:`WorkerReport`, a parameter
server's centre and figures, a calibration's timings, a connectivity probe's answer, whatever
``sparkdp.run``'s function returns). A result crosses Spark's channels, and on a Spark Connect
session the server's, so the driver must be able to read it without running anything it says:
:func:`encode` turns it into sparkdp state bytes (:mod:`sparkdp.state`: safetensors for the
tensors, JSON for everything around them) and :func:`decode` builds back only the kinds listed
here. A damaged or foreign cell is a :class:`ValueError`, never code.

What a result may hold (at any depth): ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
torch tensors (dense; they come back on the CPU), numpy arrays of numbers or booleans and numpy
scalars (back as Python numbers), lists, tuples and dicts of these (a ``state_dict`` is one), and
sparkdp's own :class:`WorkerReport`. Anything else is refused on the worker with a
:class:`ConfigError` that names its type and where it sits.

Example:
    >>> import torch
    >>> decode(encode("stage-1", 0, {"loss": 0.5, "w": torch.ones(2)}), "stage-1", 0)
    {'loss': 0.5, 'w': tensor([1., 1.])}
"""

from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any

import torch

from .. import state
from ..errors import ConfigError
from ..train.report import WorkerReport

FORMAT = "sparkdp-result/1"

#: the tags a result document uses for kinds JSON and sparkdp.state lack; a user dict holding one
#: of them as a key travels as a list of items instead, so no user key is ever read as a tag
_BYTES, _NDARRAY, _RECORD, _ITEMS = "__bytes__", "__ndarray__", "__record__", "__result_items__"
_TAGS = (_BYTES, _NDARRAY, _RECORD, _ITEMS)
#: the dataclasses a result may be, by name: each is rebuilt from its own fields, nothing else
_RECORDS: dict[str, type] = {"WorkerReport": WorkerReport}
_MAX_DEPTH = 64
#: fields of a record that are only shown (logs, summaries): a setting that is not data there (a
#: server optimizer given as a factory) travels as its text rather than failing the job
_SHOWN = {"strategy_options"}

ALLOWED = (
    "None, bool, int, float, str, bytes, torch tensors, numpy arrays of numbers or booleans, numpy scalars, "
    "and lists, tuples and dicts of them (a state_dict is one)"
)


def encode(stage: str, index: int, value: Any) -> bytes:
    """Task ``index``'s result ``value`` as bytes for the driver, marked with its ``stage``.

    Raises:
        ConfigError: ``value`` holds something that is not data (see the module docstring).
    """
    return state.to_bytes(
        {"format": FORMAT, "stage": stage, "index": index, "value": _to_wire(value, "the result", 0)}
    )


def decode(data: bytes, stage: str, index: int) -> Any:
    """The value :func:`encode` wrote for task ``index`` of ``stage``.

    Raises:
        ValueError: ``data`` is not such a result (damaged, another stage's or task's, or not
            sparkdp's at all); nothing in it was run.
    """
    try:
        document = state.from_bytes(data)
    except ValueError as err:
        raise ValueError(f"it is not a sparkdp task result ({err})") from None
    if not (isinstance(document, dict) and document.get("format") == FORMAT and "value" in document):
        raise ValueError(f"it is sparkdp state but not a task result (no {FORMAT!r} document)")
    if document.get("stage") != stage or document.get("index") != index:
        raise ValueError(
            f"it is the result of task {document.get('index')!r} of stage {document.get('stage')!r}, "
            f"not of task {index} of this stage ({stage!r})"
        )
    try:
        return _from_wire(document["value"], 0)
    except (KeyError, TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"its document is damaged ({type(err).__name__}: {err})") from None


def _refuse(value: Any, where: str, why: str = "") -> ConfigError:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return ConfigError(
        f"{where} has type {name}{why}, which sparkdp does not send back from a worker: results travel to the driver "
        f"as data, never as a pickle, and may hold {ALLOWED}. Return plain data instead (model.state_dict() "
        "rather than the model, a number rather than an object), or save anything else to a file on the worker "
        "and return its path."
    )


def _to_wire(value: Any, where: str, depth: int) -> Any:
    """``value`` as what :func:`sparkdp.state.to_bytes` stores, with tags for the kinds it lacks."""
    if depth > _MAX_DEPTH:
        raise ConfigError(
            f"the result is nested more than {_MAX_DEPTH} levels deep (a structure that contains "
            "itself?); a worker's result must be a tree of plain data."
        )
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested:
            raise _refuse(value, where, f" with layout {value.layout}")
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_BYTES: _byte_tensor(bytes(value))}
    if type(value).__module__ == "numpy":
        return _numpy(value, where)
    if isinstance(value, WorkerReport):
        return {
            _RECORD: [
                "WorkerReport",
                {
                    f.name: _to_wire(
                        _shown(getattr(value, f.name)) if f.name in _SHOWN else getattr(value, f.name),
                        f"{where}.{f.name}",
                        depth + 1,
                    )
                    for f in fields(value)
                },
            ]
        }
    if isinstance(value, (list, tuple)):
        items = [_to_wire(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        for key in value:
            if not _is_key(key):
                raise _refuse(
                    key,
                    f"a key of {where}",
                    " (a dict key must be None, a bool, number or string, or a tuple of them)",
                )
        pairs = [(k, _to_wire(v, f"{where}[{k!r}]", depth + 1)) for k, v in value.items()]
        if any(k in _TAGS for k in value):
            return {_ITEMS: [list(pair) for pair in pairs]}
        return dict(pairs)
    raise _refuse(value, where)


def _shown(value: Any) -> Any:
    """``value`` with every leaf that is not a plain JSON value (a factory, a class) as its text."""
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        shown = [_shown(v) for v in value]
        return tuple(shown) if isinstance(value, tuple) else shown
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def _is_key(key: Any) -> bool:
    if key is None or isinstance(key, (bool, int, float, str)):
        return True
    return isinstance(key, tuple) and all(_is_key(k) for k in key)


def _byte_tensor(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():  # read-only bytes: sparkdp.state only reads the tensor
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


def _numpy(value: Any, where: str) -> Any:
    import numpy as np

    if isinstance(value, np.generic) and not isinstance(value, (np.bool_, np.number)):
        raise _refuse(value, where)
    if isinstance(value, (np.bool_, np.number)):
        if isinstance(value, np.complexfloating):
            raise _refuse(value, where, " (complex)")
        return value.item()
    if not isinstance(value, np.ndarray):
        raise _refuse(value, where)
    if value.dtype.kind not in "biuf":
        raise _refuse(value, where, f" of dtype {value.dtype}")
    try:
        tensor = torch.from_numpy(
            np.ascontiguousarray(value).astype(value.dtype.newbyteorder("="), copy=False)
        )
    except (TypeError, ValueError) as err:  # a dtype torch has no tensor for
        raise _refuse(value, where, f" of dtype {value.dtype} ({err})") from None
    return {_NDARRAY: tensor}


def _from_wire(wire: Any, depth: int) -> Any:
    """What :func:`_to_wire` made of a value, built back: nested at most as deep as it lets a
    value be. Each tagged tensor is its own (:func:`sparkdp.state.from_bytes` refuses a tensor
    named twice), so the bytes and arrays built here are at most the result's own bytes."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"the result is nested more than {_MAX_DEPTH} levels deep")
    deeper = depth + 1
    if isinstance(wire, list):
        return [_from_wire(v, deeper) for v in wire]
    if isinstance(wire, tuple):
        return tuple(_from_wire(v, deeper) for v in wire)
    if isinstance(wire, dict):
        if len(wire) == 1:
            ((tag, inner),) = wire.items()
            if tag == _BYTES:
                return _tensor(inner).numpy().tobytes()
            if tag == _NDARRAY:
                return _tensor(inner).numpy()
            if tag == _RECORD:
                return _record(inner, deeper)
            if tag == _ITEMS:
                return {k: _from_wire(v, deeper) for k, v in inner}
        return {k: _from_wire(v, deeper) for k, v in wire.items()}
    return wire


def _tensor(value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"a tagged tensor is a {type(value).__name__}")
    return value


def _record(inner: Any, depth: int) -> Any:
    name, values = inner
    cls = _RECORDS.get(name)
    if cls is None or not isinstance(values, dict):
        raise ValueError(f"no result record is called {name!r}")
    expected = {f.name for f in fields(cls)}
    if set(values) != expected:
        raise ValueError(f"a {name} has the fields {sorted(expected)}, not {sorted(values)}")
    return cls(**{k: _from_wire(v, depth) for k, v in values.items()})
