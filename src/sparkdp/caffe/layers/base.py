"""The converter registry and what every converter shares.

A converter turns one :class:`~sparkdp.caffe.spec.LayerSpec` plus the shapes of its
bottom blobs into a :class:`CaffeLayer` (an ``nn.Module`` whose ``forward(*bottoms)``
returns a tuple of tops) and the shapes of its tops.  Shapes are computed from
Caffe's formulas while building, so shape errors name the layer before any data flows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError, DataError
from ...registry import Registry
from ..spec import LayerSpec
from ..textformat import Message

Shape = tuple[int, ...]
FLT_MAX = 3.4028234663852886e38  # std::numeric_limits<float>::max(), Caffe's "minus infinity" seed
FLT_MIN = 1.1754943508222875e-38  # clamp used by Caffe's log-losses

CONVERTERS: Registry[Built] = Registry("Caffe layer type")
SUPPORTED: list[str] = []  # Caffe's exact (case-sensitive) type names, in registration order


Count = int | tuple[int, int] | None


def converter(
    *types: str, bottoms: Count = None, tops: Count = None
) -> Callable[[Callable[..., Built]], Callable[..., Built]]:
    """Register ``fn(layer, shapes, ctx) -> Built`` for one or more Caffe type names.

    ``bottoms``/``tops`` (a count or a ``(low, high)`` range) are checked before ``fn``
    runs; converters whose counts depend on their parameters check for themselves."""

    def deco(fn: Callable[..., Built]) -> Callable[..., Built]:
        def checked(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
            if bottoms is not None:
                expect_bottoms(layer, shapes, *((bottoms,) if isinstance(bottoms, int) else bottoms))
            if tops is not None:
                expect_tops(layer, *((tops,) if isinstance(tops, int) else tops))
            return fn(layer, shapes, ctx)

        for name in types:
            CONVERTERS.register(name, checked)
            SUPPORTED.append(name)
        return checked

    return deco


@dataclass
class BuildContext:
    """What a converter may know besides its own layer: the net's phase and fed shapes."""

    phase: str = "TEST"
    input_shapes: dict[str, Shape] = field(default_factory=dict)


class CaffeLayer(nn.Module):
    """Base of the modules converters build.

    Attributes:
        blob_names: attribute names of the layer's Caffe blobs, in Caffe blob order.
        is_source: True for data layers, whose tops are fed by sparkdp (net inputs).
        config: names under which ``__init__`` keeps its positional arguments (a layer
            with more to set up than its settings writes its own ``__init__``).
    """

    blob_names: tuple[str, ...] = ()
    is_source = False
    config: tuple[str, ...] = ()

    def __init__(self, *values: Any) -> None:
        super().__init__()
        for name, value in zip(self.config, values, strict=True):
            setattr(self, name, value)

    def add_weight_bias(self, weight_shape: Shape, bias_size: int | None) -> None:
        """Zero ``weight`` and, with a ``bias_size``, ``bias`` blobs (else ``bias`` is None), and their blob_names."""
        self.weight = nn.Parameter(torch.zeros(weight_shape))
        self.register_parameter(
            "bias", nn.Parameter(torch.zeros(bias_size)) if bias_size is not None else None
        )
        self.blob_names = ("weight", "bias") if bias_size is not None else ("weight",)

    def caffe_blobs(self) -> list[torch.Tensor]:
        return [getattr(self, name) for name in self.blob_names]


@dataclass
class Built:
    module: CaffeLayer
    top_shapes: list[Shape]


# -------------------------------------------------------------------- small helpers


def fail(layer: LayerSpec, message: str) -> ConfigError:
    """A ConfigError that says where the layer is and what it is."""
    where = f"{layer.where}: " if layer.where else ""
    return ConfigError(f"{where}{layer.describe()}: {message}")


def expect_bottoms(layer: LayerSpec, shapes: list[Shape], low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(shapes) <= high:
        wanted = str(low) if low == high else f"{low} to {high}" if high < 99 else f"at least {low}"
        raise fail(layer, f"needs {wanted} bottom blob(s), got {len(shapes)}")


def expect_tops(layer: LayerSpec, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(layer.tops) <= high:
        wanted = str(low) if low == high else f"{low} to {high}"
        raise fail(layer, f"needs {wanted} top blob(s), got {len(layer.tops)}")


def check_range(values: torch.Tensor, high: int, who: str, what: str, note: str = "") -> None:
    """DataError naming (up to five of) the ``values`` outside ``[0, high)``."""
    outside = (values < 0) | (values >= high)
    if bool(outside.any()):
        raise DataError(f"{who}: {what} must lie in [0, {high}){note}; got {values[outside][:5].tolist()}")


def one_label_per_row(layer: LayerSpec, shapes: list[Shape]) -> None:
    if count(shapes[1]) != shapes[0][0]:
        raise fail(layer, f"needs one label per row: {shapes[0][0]} rows but label shape {list(shapes[1])}")


def same_shapes(layer: LayerSpec, shapes: list[Shape]) -> None:
    for i, shape in enumerate(shapes[1:], start=1):
        if shape != shapes[0]:
            raise fail(
                layer,
                f"bottom {layer.bottoms[i]!r} has shape {list(shape)} but bottom "
                f"{layer.bottoms[0]!r} has shape {list(shapes[0])}; they must be equal",
            )


def canonical_axis(layer: LayerSpec, axis: int, ndim: int) -> int:
    """``Blob::CanonicalAxisIndex``: negative axes count from the end."""
    if not -ndim <= axis < ndim:
        raise fail(layer, f"axis {axis} is out of range for a {ndim}-D blob")
    return axis % ndim if ndim else 0


def count(shape: Shape, start: int = 0, end: int | None = None) -> int:
    return math.prod(shape[start:end])


def enum(layer: LayerSpec, msg: Message, name: str, default: str, values: tuple[str, ...]) -> str:
    """An enum field given as a bare name or its number (index into ``values``)."""
    raw: Any = msg.get(name, default)
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(values):
        return values[raw]
    if str(raw) not in values:
        raise fail(layer, f"{name} must be one of {', '.join(values)}; got '{raw}'")
    return str(raw)


def number(layer: LayerSpec, msg: Message, name: str, default: float) -> float:
    value = msg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(layer, f"{name} must be a number; got {value!r}")
    return float(value)


def integer(layer: LayerSpec, msg: Message, name: str, default: int | None = None) -> int:
    value = msg.get(name, default)
    if value is None:
        raise fail(layer, f"{name} is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(layer, f"{name} must be an integer; got {value!r}")
    return value


def flag(layer: LayerSpec, msg: Message, name: str, default: bool) -> bool:
    value = msg.get(name, default)
    if not isinstance(value, bool):
        raise fail(layer, f"{name} must be true or false; got {value!r}")
    return value


def shape_of(layer: LayerSpec, blob_shape: Message) -> Shape:
    dims = blob_shape.getall("dim")
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in dims):
        raise fail(layer, f"shape dims must be non-negative integers; got {dims}")
    return tuple(dims)
