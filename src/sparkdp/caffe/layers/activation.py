"""Neuron layers: element-wise, shape-preserving, may be in-place in the prototxt.

In-place in Caffe (``top == bottom``) is only a name rebinding here; no torch op
runs in place, so other consumers of the old value keep it (and autograd works).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    converter,
    fail,
    flag,
    number,
)
from .fillers import fill_


def _power(x: torch.Tensor, a: dict[str, float]) -> torch.Tensor:
    inner = a["shift"] + a["scale"] * x
    return inner if a["power"] == 1.0 else inner ** a["power"]


def _exp(x: torch.Tensor, a: dict[str, float]) -> torch.Tensor:
    return torch.exp(a["log_base"] * (a["shift"] + a["scale"] * x))


def _log(x: torch.Tensor, a: dict[str, float]) -> torch.Tensor:
    return torch.log(a["shift"] + a["scale"] * x) / a["log_base"]


def _bnll(x: torch.Tensor, a: dict[str, float]) -> torch.Tensor:
    # = Caffe's  x > 0 ? x + log(1 + e^-x) : log(1 + e^x), without overflow in either branch
    return x.clamp(min=0) + torch.log1p(torch.exp(-x.abs()))


_FUNCTIONS: dict[str, Callable[[torch.Tensor, dict[str, float]], torch.Tensor]] = {
    "ReLU": lambda x, a: F.leaky_relu(x, a["slope"]) if a["slope"] else F.relu(x),
    "ELU": lambda x, a: F.elu(x, a["alpha"]),
    "Sigmoid": lambda x, a: torch.sigmoid(x),
    "TanH": lambda x, a: torch.tanh(x),
    "AbsVal": lambda x, a: torch.abs(x),
    "Power": _power,
    "Exp": _exp,
    "Log": _log,
    "BNLL": _bnll,
    "Threshold": lambda x, a: (x > a["threshold"]).to(x.dtype),
    "Clip": lambda x, a: torch.clamp(x, a["min"], a["max"]),
    "Swish": lambda x, a: x * torch.sigmoid(a["beta"] * x),
}


class Neuron(CaffeLayer):
    """One element-wise function, chosen by Caffe type name (picklable: no closures stored)."""

    config = ("kind", "args")  # args: the function's settings by name
    kind: str
    args: dict[str, float]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (_FUNCTIONS[self.kind](x, self.args),)

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.args}" if self.args else self.kind


def _base(layer: LayerSpec, value: float) -> float:
    if value == -1:
        return 1.0  # base -1 means e
    if value <= 0:
        raise fail(layer, f"base must be positive or -1 (for e); got {value}")
    return math.log(value)


_EXP_ARGS = (("log_base", "base", -1.0), ("scale", "scale", 1.0), ("shift", "shift", 0.0))
_ARGS = {  # type -> (its parameter message, ((argument, field, default), ...))
    "ReLU": ("relu_param", (("slope", "negative_slope", 0.0),)),
    "ELU": ("elu_param", (("alpha", "alpha", 1.0),)),
    "Power": ("power_param", (("power", "power", 1.0), ("scale", "scale", 1.0), ("shift", "shift", 0.0))),
    "Exp": ("exp_param", _EXP_ARGS),
    "Log": ("log_param", _EXP_ARGS),
    "Threshold": ("threshold_param", (("threshold", "threshold", 0.0),)),
    "Clip": ("clip_param", (("min", "min", -math.inf), ("max", "max", math.inf))),
    "Swish": ("swish_param", (("beta", "beta", 1.0),)),
}


def _args(layer: LayerSpec) -> dict[str, Any]:
    param, fields = _ARGS.get(layer.type, ("", ()))
    args = {arg: number(layer, layer.sub(param), name, default) for arg, name, default in fields}
    if "log_base" in args:
        args["log_base"] = _base(layer, args["log_base"])
    return args


@converter(*_FUNCTIONS, bottoms=1, tops=1)
def neuron(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    return Built(Neuron(layer.type, _args(layer)), [shapes[0]])


class PReLU(CaffeLayer):
    """``max(x, 0) + a_c · min(x, 0)``; shared slope has Caffe's 0-axis blob shape ``[]``."""

    blob_names = ("weight",)

    def __init__(self, channels: int | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(() if channels is None else (channels,)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        a: torch.Tensor = self.weight
        if a.dim() and x.dim() >= 2:
            a = a.view(1, -1, *([1] * (x.dim() - 2)))
        return (torch.where(x > 0, x, a * x),)


@converter("PReLU", bottoms=1, tops=1)
def prelu(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("prelu_param")
    shape = shapes[0]
    channels = 1 if len(shape) < 2 else shape[1]  # Caffe: 1 channel for 1-D input
    module = PReLU(None if flag(layer, p, "channel_shared", False) else channels)
    fill_(module.weight, p.get("filler"), default_value=0.25, where=f"{layer.describe()}: ")
    return Built(module, [shape])


class Dropout(CaffeLayer):
    """Inverted dropout in TRAIN phase while ``module.training``; identity otherwise."""

    config = ("ratio", "train_phase")
    ratio: float
    train_phase: bool

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.dropout(x, self.ratio, self.training and self.train_phase),)


@converter("Dropout", bottoms=1, tops=1)
def dropout(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    ratio = number(layer, layer.sub("dropout_param"), "dropout_ratio", 0.5)
    if not 0.0 <= ratio < 1.0:
        raise fail(layer, f"dropout_ratio must be in [0, 1); got {ratio}")
    return Built(Dropout(ratio, (layer.phase or ctx.phase) == "TRAIN"), [shapes[0]])
