"""Caffe's SolverParameter as a frozen dataclass: fields, Caffe's defaults, validation.

Its own module so that the rate schedule (``lr_policy``) and the solver (``solver``) can
both use it without importing each other; every check of a solver's settings is here.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .optim import REGULARIZATION_TYPES, SOLVER_TYPES
from .textformat import Message, parse, parse_file

__all__ = ["LR_POLICIES", "SolverSpec", "read_solver_spec"]

LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")

# V1 `solver_type` enum values -> V2 `type` strings (UpgradeSolverType).
_V1_SOLVER_TYPES = ("SGD", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM")
_V1_TO_V2 = dict(zip(_V1_SOLVER_TYPES, SOLVER_TYPES, strict=True))
_ENUMS = {"solver_mode": ("CPU", "GPU"), "snapshot_format": ("HDF5", "BINARYPROTO")}


def _f(kind: str, default: Any) -> Any:
    """A dataclass field annotated with its text-format kind (``float``, ``int*``...)."""
    return field(default=default, metadata={"kind": kind})


@dataclass(frozen=True)
class SolverSpec:
    """Caffe's SolverParameter with Caffe's defaults (``caffe.proto``).

    Repeated fields are tuples; message fields (net_param, test_state...) stay
    parsed :class:`~sparkdp.caffe.textformat.Message` objects.  The V1 field
    ``solver_type`` is upgraded into ``type`` and not kept.
    """

    net: str | None = _f("str", None)
    net_param: Message | None = _f("msg", None)
    train_net: str | None = _f("str", None)
    test_net: tuple[str, ...] = _f("str*", ())
    train_net_param: Message | None = _f("msg", None)
    test_net_param: tuple[Message, ...] = _f("msg*", ())
    train_state: Message | None = _f("msg", None)
    test_state: tuple[Message, ...] = _f("msg*", ())
    test_iter: tuple[int, ...] = _f("int*", ())
    test_interval: int = _f("int", 0)
    test_compute_loss: bool = _f("bool", False)
    test_initialization: bool = _f("bool", True)
    base_lr: float = _f("float", 0.0)
    display: int = _f("int", 0)
    average_loss: int = _f("int", 1)
    max_iter: int = _f("int", 0)
    iter_size: int = _f("int", 1)
    lr_policy: str = _f("str", "")
    gamma: float = _f("float", 0.0)
    power: float = _f("float", 0.0)
    momentum: float = _f("float", 0.0)
    weight_decay: float = _f("float", 0.0)
    regularization_type: str = _f("str", "L2")
    stepsize: int = _f("int", 0)
    stepvalue: tuple[int, ...] = _f("int*", ())
    clip_gradients: float = _f("float", -1.0)
    snapshot: int = _f("int", 0)
    snapshot_prefix: str = _f("str", "")
    snapshot_diff: bool = _f("bool", False)
    snapshot_format: str = _f("enum", "BINARYPROTO")
    solver_mode: str = _f("enum", "GPU")
    device_id: int = _f("int", 0)
    random_seed: int = _f("int", -1)
    type: str = _f("str", "SGD")
    delta: float = _f("float", 1e-8)
    momentum2: float = _f("float", 0.999)
    rms_decay: float = _f("float", 0.99)
    debug_info: bool = _f("bool", False)
    snapshot_after_train: bool = _f("bool", True)
    layer_wise_reduce: bool = _f("bool", True)
    weights: tuple[str, ...] = _f("str*", ())

    def __post_init__(self) -> None:
        if self.lr_policy not in LR_POLICIES:
            got = "no lr_policy" if not self.lr_policy else f"lr_policy {self.lr_policy!r}"
            raise ConfigError(
                f"solver has {got}; allowed: {', '.join(LR_POLICIES)}. "
                'Add e.g. `lr_policy: "fixed"` to the solver.'
            )
        if self.type not in SOLVER_TYPES:
            same_case = [t for t in SOLVER_TYPES if t.lower() == self.type.lower()]
            close = same_case or difflib.get_close_matches(self.type, SOLVER_TYPES, n=1, cutoff=0.3)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown solver type {self.type!r}; allowed: {', '.join(SOLVER_TYPES)} "
                f"(case-sensitive, as in Caffe).{hint}"
            )
        if self.regularization_type not in REGULARIZATION_TYPES:
            raise ConfigError(
                f"unknown regularization_type {self.regularization_type!r}; allowed: "
                f"{', '.join(REGULARIZATION_TYPES)}."
            )
        if self.iter_size < 1:
            raise ConfigError(f"iter_size must be >= 1; received iter_size: {self.iter_size}.")
        if self.type in ("AdaGrad", "RMSProp") and self.momentum != 0:
            raise ConfigError(
                f"momentum cannot be used with {self.type} (received momentum: {self.momentum}); "
                "remove `momentum` from the solver, as Caffe requires."
            )
        if self.lr_policy == "step" and self.stepsize <= 0:
            raise ConfigError(
                f"lr_policy 'step' needs stepsize > 0; received stepsize: {self.stepsize}. "
                "Set e.g. `stepsize: 10000`."
            )
        if self.lr_policy == "poly" and self.max_iter <= 0:
            raise ConfigError(f"lr_policy 'poly' needs max_iter > 0; received max_iter: {self.max_iter}.")
        if self.test_iter and self.test_interval <= 0:
            raise ConfigError(
                f"test_iter is set ({list(self.test_iter)}) but test_interval is {self.test_interval}; "
                "set `test_interval` > 0 (iterations between test passes) or remove test_iter."
            )
        train_nets = [n for n in ("train_net_param", "train_net", "net_param", "net") if getattr(self, n)]
        if len(train_nets) > 1:
            raise ConfigError(
                f"solver gives more than one train net ({', '.join(train_nets)}); keep exactly one."
            )

    @classmethod
    def from_message(cls, msg: Message, filename: str | None = None) -> SolverSpec:
        """Build from a parsed SolverParameter, checking names, types and repeats.

        Args:
            msg: the parsed solver file.
            filename: the solver file, for Caffe's default ``snapshot_prefix``
                (the file name without extension, or ``DIR/stem`` if the prefix is
                a directory).
        """
        kinds = {f.name: f.metadata["kind"] for f in dataclasses.fields(cls)}
        where = msg.where()
        values: dict[str, Any] = {}
        for name in msg.names():
            if name == "solver_type":
                continue
            if name not in kinds:
                close = difflib.get_close_matches(name, [*kinds, "solver_type"], n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{where}: unknown solver field {name!r}.{hint}")
            kind, raw = kinds[name], msg.getall(name)
            if not kind.endswith("*") and len(raw) > 1:
                raise ConfigError(
                    f"{where}: solver field {name!r} is given {len(raw)} times; it takes one value."
                )
            converted = [_convert(name, kind.rstrip("*"), v, where) for v in raw]
            values[name] = tuple(converted) if kind.endswith("*") else converted[0]
        if msg.has("solver_type"):
            if msg.has("type"):
                raise ConfigError(
                    f"{where}: both the old `solver_type` (enum) and the new `type` (string) are set; "
                    "keep only `type`, as Caffe's upgrade requires."
                )
            old = msg.getall("solver_type")
            if len(old) > 1:
                raise ConfigError(f"{where}: solver field 'solver_type' is given {len(old)} times.")
            values["type"] = _V1_TO_V2[_convert("solver_type", "enum", old[0], where)]
        if filename is not None:
            values["snapshot_prefix"] = _default_prefix(values.get("snapshot_prefix", ""), filename)
        return cls(**values)


def _convert(name: str, kind: str, value: Any, where: str) -> Any:
    """One text-format value -> the Python value of ``kind``, or a clear error."""
    bad = None
    if kind == "msg":
        bad = None if isinstance(value, Message) else "a message { ... }"
    elif isinstance(value, Message):
        bad = f"a {kind} value"
    elif kind == "float":
        bad = None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
        value = float(value) if bad is None else value
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        bad = None if ok else "an integer"
    elif kind == "bool":
        bad = None if isinstance(value, bool) else "true or false"
    elif kind == "str":
        bad = None if isinstance(value, str) else "a quoted string"
        value = str(value) if bad is None else value
    elif kind == "enum":
        choices = _ENUMS.get(name, _V1_SOLVER_TYPES)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(choices):
            value = choices[value]
        bad = None if value in choices else f"one of {', '.join(choices)}"
        value = str(value) if bad is None else value
    if bad is not None:
        raise ConfigError(f"{where}: solver field {name!r} needs {bad}; received {value!r}.")
    return value


def _default_prefix(prefix: str, filename: str) -> str:
    # UpgradeSnapshotPrefixProperty: unset -> solver path without extension;
    # a directory -> that directory / solver file stem.
    if not prefix:
        return str(Path(filename).with_suffix(""))
    if prefix.endswith(os.sep) or os.path.isdir(prefix):
        return str(Path(prefix) / Path(filename).stem)
    return prefix


def read_solver_spec(source: Message | str | os.PathLike[str] | SolverSpec) -> SolverSpec:
    """A :class:`SolverSpec` from a Message, a solver file path, or solver text."""
    if isinstance(source, SolverSpec):
        return source
    if isinstance(source, Message):
        return SolverSpec.from_message(source)
    if isinstance(source, os.PathLike) or (isinstance(source, str) and os.path.isfile(source)):
        return SolverSpec.from_message(parse_file(source), filename=os.fspath(source))
    if isinstance(source, str) and (":" in source or "{" in source or not source.strip()):
        return SolverSpec.from_message(parse(source))
    raise ConfigError(
        f"solver source {source!r} is neither an existing file nor solver text; "
        "pass a path to a solver.prototxt, its text, or a parsed Message."
    )
