"""Caffe solvers (``solver.prototxt``) on top of torch: settings, rate schedule, update.

:func:`load_solver` reads a SolverParameter (file, text or parsed Message) into a
frozen :class:`SolverSpec` and returns a :class:`CaffeSolver` over any torch
parameters.  One :meth:`CaffeSolver.step` is Caffe's ``ApplyUpdate``: clip the
global gradient norm, divide by ``iter_size``, regularize, compute the update of
the solver type, apply it, ``iter += 1``.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(3))
    >>> solver = load_solver('base_lr: 0.1 lr_policy: "fixed" momentum: 0.9', [w])
    >>> w.grad = torch.ones(3); solver.step(); solver.iter
    1
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .lr_policy import LR_POLICIES, CaffeLRScheduler, learning_rate
from .optim import REGULARIZATION_TYPES, SOLVER_TYPES, make_optimizer
from .textformat import Message, parse, parse_file

__all__ = ["CaffeSolver", "SolverSpec", "load_solver", "read_solver_spec"]

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


def read_solver_spec(source: Message | str | os.PathLike[str]) -> SolverSpec:
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


def _param_groups(params_or_net: Any, spec: SolverSpec) -> list[dict[str, Any]]:
    """Torch param groups with ``lr_mult``/``decay_mult``; lr and decay from the spec."""
    if hasattr(params_or_net, "caffe_layers") and callable(getattr(params_or_net, "param_groups", None)):
        groups = list(params_or_net.param_groups(spec.base_lr, spec.weight_decay))
    elif isinstance(params_or_net, nn.Module):
        groups = [{"params": list(params_or_net.parameters())}]
    elif isinstance(params_or_net, torch.Tensor):
        groups = [{"params": [params_or_net]}]
    elif isinstance(params_or_net, Iterable):
        items = list(params_or_net)
        groups = items if items and isinstance(items[0], dict) else [{"params": items}]
    else:
        raise ConfigError(
            f"cannot take parameters from a {type(params_or_net).__name__}; pass a CaffeNet, an "
            "nn.Module, an iterable of tensors, or torch param-group dicts."
        )
    out = []
    for group in groups:
        g = dict(group)
        g["params"] = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
        # The rate is set by the scheduler and multiplied by lr_mult inside the
        # optimizer, so a group's own lr/weight_decay (possibly pre-multiplied) is replaced.
        g["lr"], g["weight_decay"] = spec.base_lr, spec.weight_decay
        g.setdefault("lr_mult", 1.0)
        g.setdefault("decay_mult", 1.0)
        out.append(g)
    return out


class CaffeSolver:
    """Caffe's solver loop pieces over torch parameters.

    The caller does ``zero_grad()``, ``iter_size`` forward/backward passes (the
    gradients accumulate), then :meth:`step`.  In data-parallel training the
    gradients are averaged across workers before :meth:`step`, as Caffe's NCCL
    solver does.

    Attributes:
        spec: the solver settings.
        optimizer: the :mod:`sparkdp.caffe.optim` optimizer of ``spec.type``.
        scheduler: a :class:`CaffeLRScheduler` holding the rate of the next update.
        iter: updates applied so far.
    """

    def __init__(self, spec: SolverSpec, params_or_net: Any) -> None:
        self.spec = spec
        self.optimizer = make_optimizer(spec, _param_groups(params_or_net, spec))
        self.scheduler = CaffeLRScheduler(self.optimizer, spec)
        self.iter = 0

    # Plain views of the settings a training loop needs.
    max_iter = property(lambda self: self.spec.max_iter)
    test_interval = property(lambda self: self.spec.test_interval)
    test_iter = property(lambda self: self.spec.test_iter)
    snapshot = property(lambda self: self.spec.snapshot)
    snapshot_prefix = property(lambda self: self.spec.snapshot_prefix)
    display = property(lambda self: self.spec.display)
    iter_size = property(lambda self: self.spec.iter_size)

    @property
    def rate(self) -> float:
        """The rate the next :meth:`step` uses (before ``lr_mult``)."""
        return float(self.scheduler.get_last_lr()[0])

    def lr_at(self, it: int) -> float:
        """Caffe's rate at iteration ``it`` (fresh-run multistep counter)."""
        return learning_rate(self.spec, it)

    def params(self) -> list[torch.Tensor]:
        """The learnable parameters, in Caffe's ``learnable_params`` order."""
        return self.optimizer.learnable()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Same as ``optimizer.zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """Clip -> normalize -> regularize -> update -> ``iter += 1``."""
        grads = [p.grad for p in self.params() if p.grad is not None]
        clip = self.spec.clip_gradients
        if clip >= 0 and grads:
            # Caffe clips the un-normalised iter_size sum, before weight decay.
            norm = math.sqrt(float(sum(g.float().pow(2).sum() for g in grads)))
            if norm > clip:
                for g in grads:
                    g.mul_(clip / norm)
        if self.spec.iter_size != 1:
            scale = float(torch.tensor(1.0, dtype=torch.float32) / self.spec.iter_size)
            for g in grads:
                g.mul_(scale)
        self.optimizer.step()
        self.iter += 1
        self.scheduler.step()

    def test_due(self, it: int | None = None) -> bool:
        """Whether Caffe runs the test nets before the update of iteration ``it``."""
        it = self.iter if it is None else it
        return (
            self.test_interval > 0
            and it % self.test_interval == 0
            and (it > 0 or self.spec.test_initialization)
        )

    def snapshot_due(self, it: int | None = None) -> bool:
        """Whether Caffe snapshots after reaching iteration ``it`` (default: now)."""
        it = self.iter if it is None else it
        return self.snapshot > 0 and it > 0 and it % self.snapshot == 0

    def snapshot_path(self, it: int | None = None, extension: str = ".caffemodel") -> Path:
        """``{snapshot_prefix}_iter_{N}.caffemodel``, Caffe's ``SnapshotFilename``."""
        it = self.iter if it is None else it
        return Path(f"{self.snapshot_prefix}_iter_{it}{extension}")

    def write_snapshot(self, net: Any) -> Path:
        """Save ``net``'s weights (binary proto) to :meth:`snapshot_path`; returns the path."""
        from .weights import save_weights

        path = self.snapshot_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        save_weights(net, path)
        return path

    def state_dict(self) -> dict[str, Any]:
        """Caffe's SolverState: ``iter``, ``current_step`` and ``history`` tensors."""
        return {
            "type": self.spec.type,
            "iter": self.iter,
            "current_step": self.scheduler.previous_step,
            "history": self.optimizer.history(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` output (same solver type and parameters)."""
        if state.get("type", self.spec.type) != self.spec.type:
            raise ConfigError(
                f"solver state was saved by a {state['type']} solver; this solver is {self.spec.type}. "
                "Use the same solver type to resume, or start without the state."
            )
        self.iter = int(state["iter"])
        self.optimizer.load_history(list(state["history"]), self.iter)
        self.scheduler.restore(self.iter, int(state["current_step"]))


def load_solver(solver: Message | str | os.PathLike[str] | SolverSpec, params_or_net: Any) -> CaffeSolver:
    """Read a Caffe solver and build a :class:`CaffeSolver` over the parameters.

    Args:
        solver: path to a ``solver.prototxt``, its text, a parsed Message or a spec.
        params_or_net: a CaffeNet (its ``param_groups`` give lr_mult/decay_mult), an
            ``nn.Module``, an iterable of tensors or of torch param-group dicts.

    Raises:
        ConfigError: on an unknown field, policy or type, or invalid values.
    """
    return CaffeSolver(read_solver_spec(solver), params_or_net)
