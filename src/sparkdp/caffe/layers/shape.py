"""Flatten, Reshape, ArgMax and Tile."""

from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    converter,
    count,
    fail,
    flag,
    integer,
)


class Flatten(CaffeLayer):
    config = ("axis", "end_axis")
    axis: int
    end_axis: int

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.flatten(x, self.axis, self.end_axis),)


@converter("Flatten", bottoms=1, tops=1)
def flatten(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p, shape = layer.sub("flatten_param"), shapes[0]
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shape))
    end = canonical_axis(layer, int(p.get("end_axis", -1)), len(shape))
    if end < axis:
        raise fail(layer, f"end_axis {end} is before axis {axis}")
    return Built(Flatten(axis, end), [(*shape[:axis], count(shape, axis, end + 1), *shape[end + 1 :])])


def reshaped(dims: Shape, bottom: Shape, axis: int, num_axes: int, who: str = "Reshape") -> Shape:
    """Caffe's ``ReshapeLayer::Reshape``: 0 copies the bottom dim at the same position, -1 is inferred.

    Raises:
        ConfigError: a bad axis range, several -1, or a count that does not match.
    """
    ndim = len(bottom)
    start = axis if axis >= 0 else ndim + axis + 1
    end = ndim if num_axes == -1 else start + num_axes
    if not 0 <= start <= ndim or num_axes < -1 or end > ndim:
        raise ConfigError(f"{who}: axis {axis} / num_axes {num_axes} do not fit input shape {list(bottom)}")
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise ConfigError(f"{who}: shape {list(dims)} may hold one -1 and otherwise dims >= 0")
    top = list(bottom[:start]) + list(dims) + list(bottom[end:])
    for i, d in enumerate(dims):
        if d == 0:
            if start + i >= ndim:
                raise ConfigError(
                    f"{who}: dim {i} is 0 (copy) but input shape {list(bottom)} has no axis {start + i}"
                )
            top[start + i] = bottom[start + i]
    if -1 in dims:
        known = math.prod(d for d in top if d != -1)
        total = math.prod(bottom)
        if known == 0 or total % known:
            raise ConfigError(f"{who}: cannot infer the -1 in {list(dims)} for input shape {list(bottom)}")
        top[top.index(-1)] = total // known
    if math.prod(top) != math.prod(bottom):
        raise ConfigError(
            f"{who}: output shape {top} has {math.prod(top)} elements but input shape "
            f"{list(bottom)} has {math.prod(bottom)}"
        )
    return tuple(top)


class Reshape(CaffeLayer):
    config = ("dims", "axis", "num_axes", "who")
    dims: Shape
    axis: int
    num_axes: int
    who: str

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x.reshape(reshaped(self.dims, tuple(x.shape), self.axis, self.num_axes, self.who)),)


@converter("Reshape", bottoms=1, tops=1)
def reshape(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("reshape_param")
    dims = tuple(int(d) for d in (p.get("shape").getall("dim") if p.has("shape") else []))
    axis, num_axes = integer(layer, p, "axis", 0), integer(layer, p, "num_axes", -1)
    who = f"{layer.where}: {layer.describe()}"
    return Built(Reshape(dims, axis, num_axes, who), [reshaped(dims, shapes[0], axis, num_axes, who)])


def _top_k(x: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k like Caffe's partial_sort over (value, index) pairs: ties go to the larger index."""
    size = x.shape[dim]
    values, flipped = torch.sort(torch.flip(x, (dim,)), dim=dim, descending=True, stable=True)
    index = (size - 1) - flipped
    return values.narrow(dim, 0, k), index.narrow(dim, 0, k)


class ArgMax(CaffeLayer):
    config = ("top_k", "out_max_val", "axis")
    top_k: int
    out_max_val: bool
    axis: int | None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        if self.axis is not None:
            values, index = _top_k(x, self.top_k, self.axis)
            return (values if self.out_max_val else index.to(x.dtype),)
        values, index = _top_k(x.reshape(x.shape[0], -1), self.top_k, 1)
        parts = [index.to(x.dtype), values] if self.out_max_val else [index.to(x.dtype)]
        out = torch.stack(parts, dim=1)  # (N, 1 or 2, top_k)
        return (out.reshape(*out.shape, *([1] * (x.dim() - 3))),)


@converter("ArgMax", bottoms=1, tops=1)
def argmax(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p, shape = layer.sub("argmax_param"), shapes[0]
    top_k, out_max_val = integer(layer, p, "top_k", 1), flag(layer, p, "out_max_val", False)
    axis = canonical_axis(layer, int(p.get("axis")), len(shape)) if p.has("axis") else None
    limit = count(shape, 1) if axis is None else shape[axis]
    if not 1 <= top_k <= limit:
        raise fail(layer, f"top_k must be in [1, {limit}]; got {top_k}")
    if axis is not None:
        top = (*shape[:axis], top_k, *shape[axis + 1 :])
    else:
        top = (shape[0], 2 if out_max_val else 1, top_k, *([1] * (len(shape) - 3)))
    return Built(ArgMax(top_k, out_max_val, axis), [top])


class Tile(CaffeLayer):
    """``tile_layer.cpp``: the block from ``axis`` on is repeated ``tiles`` times (like ``Tensor.repeat``)."""

    config = ("axis", "tiles")
    axis: int
    tiles: int

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        reps = [1] * x.dim()
        reps[self.axis] = self.tiles
        return (x.repeat(*reps),)


@converter("Tile", bottoms=1, tops=1)
def tile(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("tile_param")
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shapes[0]))
    tiles = integer(layer, p, "tiles")
    if tiles <= 0:
        raise fail(layer, f"tiles must be positive; got {tiles}")
    top = list(shapes[0])
    top[axis] *= tiles
    return Built(Tile(axis, tiles), [tuple(top)])
