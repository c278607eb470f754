"""Layers that join, split or select blobs: Concat, Slice, Split, Eltwise, Crop, Silence."""

from __future__ import annotations

import torch

from ..spec import LayerSpec
from ..textformat import Message
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    converter,
    enum,
    fail,
    same_shapes,
)


def _legacy_axis(layer: LayerSpec, p: Message, legacy: str, ndim: int) -> int:
    """``axis`` or its deprecated uint32 spelling (``concat_dim``/``slice_dim``), not both."""
    if p.has("axis") and p.has(legacy):
        raise fail(layer, f"give either axis or the deprecated {legacy}, not both")
    if p.has(legacy):
        value = int(p.get(legacy))
        if not 0 <= value < ndim:
            raise fail(layer, f"{legacy} {value} is out of range for a {ndim}-D blob")
        return value
    return canonical_axis(layer, int(p.get("axis", 1)), ndim)


class Concat(CaffeLayer):
    config = ("axis",)
    axis: int

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.cat(xs, dim=self.axis),)


@converter("Concat", bottoms=(1, 99), tops=1)
def concat(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    axis = _legacy_axis(layer, layer.sub("concat_param"), "concat_dim", len(shapes[0]))
    first = shapes[0]
    for name, shape in zip(layer.bottoms[1:], shapes[1:], strict=True):
        if len(shape) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(shape, first, strict=True)) if i != axis
        ):
            raise fail(
                layer,
                f"bottom {name!r} has shape {list(shape)} but bottom {layer.bottoms[0]!r} has "
                f"shape {list(first)}; all dims except axis {axis} must match",
            )
    top = (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :])
    return Built(Concat(axis), [top])


class Slice(CaffeLayer):
    config = ("axis", "sizes")
    axis: int
    sizes: list[int]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.split(x, self.sizes, dim=self.axis))


@converter("Slice", bottoms=1, tops=(1, 999))
def slice_layer(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("slice_param")
    shape = shapes[0]
    axis = _legacy_axis(layer, p, "slice_dim", len(shape))
    dim, n = shape[axis], len(layer.tops)
    points = [int(v) for v in p.getall("slice_point")]
    if points:
        if len(points) != n - 1:
            raise fail(layer, f"{n} tops need {n - 1} slice_point values; got {len(points)}")
        bounds = [0, *points, dim]
        if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
            raise fail(layer, f"slice_point {points} must increase strictly within (0, {dim}) (axis {axis})")
        sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    else:
        if dim % n:
            raise fail(
                layer, f"cannot split axis {axis} of size {dim} equally into {n} tops; give slice_point"
            )
        sizes = [dim // n] * n
    tops = [(*shape[:axis], size, *shape[axis + 1 :]) for size in sizes]
    return Built(Slice(axis, sizes), tops)


class Split(CaffeLayer):
    config = ("n",)
    n: int

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x,) * self.n  # autograd sums the consumers' gradients, like Caffe's Split backward


@converter("Split", bottoms=1, tops=(1, 999))
def split(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    return Built(Split(len(layer.tops)), [shapes[0]] * len(layer.tops))


class Eltwise(CaffeLayer):
    config = ("operation", "coeffs")
    operation: str
    coeffs: list[float]

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor]:
        out = xs[0]
        if self.operation == "SUM":
            out = xs[0] * self.coeffs[0] if self.coeffs[0] != 1 else xs[0]
            for c, x in zip(self.coeffs[1:], xs[1:], strict=True):
                out = out + (x if c == 1 else c * x)
        elif self.operation == "PROD":
            for x in xs[1:]:
                out = out * x
        else:
            # Caffe: bottom1 wins ties against bottom0 (a > b ? a : b); later bottoms only when
            # strictly greater.  torch.where sends the whole gradient to the chosen input.
            for i, x in enumerate(xs[1:], start=1):
                out = torch.where(x >= out if i == 1 else x > out, x, out)
        return (out,)


@converter("Eltwise", bottoms=(2, 99), tops=1)
def eltwise(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    same_shapes(layer, shapes)
    p = layer.sub("eltwise_param")
    operation = enum(layer, p, "operation", "SUM", ("PROD", "SUM", "MAX"))
    coeffs = [float(c) for c in p.getall("coeff")]
    if coeffs and operation != "SUM":
        raise fail(layer, "coeff applies to operation SUM only")
    if coeffs and len(coeffs) != len(shapes):
        raise fail(layer, f"needs one coeff per bottom ({len(shapes)}); got {len(coeffs)}")
    return Built(Eltwise(operation, coeffs or [1.0] * len(shapes)), [shapes[0]])


class Crop(CaffeLayer):
    config = ("axis", "offsets")
    axis: int
    offsets: list[int]

    def forward(self, x: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor]:
        for i, offset in enumerate(self.offsets):
            dim = self.axis + i
            x = x.narrow(dim, offset, like.shape[dim])
        return (x,)


@converter("Crop", bottoms=2, tops=1)
def crop(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("crop_param")
    big, like = shapes
    if len(big) != len(like):
        raise fail(layer, f"bottoms must have the same number of axes; got {list(big)} and {list(like)}")
    axis = canonical_axis(layer, int(p.get("axis", 2)), len(big))
    n = len(big) - axis
    given = [int(v) for v in p.getall("offset")]
    if len(given) not in (0, 1, n):
        raise fail(layer, f"offset needs 0, 1 or {n} values (one per cropped axis); got {len(given)}")
    offsets = given * n if len(given) == 1 else given or [0] * n
    for i, offset in enumerate(offsets):
        dim = axis + i
        if offset < 0 or big[dim] - offset < like[dim]:
            raise fail(
                layer,
                f"cannot crop axis {dim} of size {big[dim]} at offset {offset} to size {like[dim]} "
                f"(shapes {list(big)} and {list(like)})",
            )
    return Built(Crop(axis, offsets), [(*big[:axis], *like[axis:])])


class Silence(CaffeLayer):
    def forward(self, *xs: torch.Tensor) -> tuple[()]:
        return ()


@converter("Silence", bottoms=(1, 99), tops=0)
def silence(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    return Built(Silence(), [])
