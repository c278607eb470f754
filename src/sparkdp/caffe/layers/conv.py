"""Convolution, Deconvolution and Im2col (``base_conv_layer.cpp``, ``conv_layer.cpp``, ``deconv_layer.cpp``).

Blob layouts equal torch's: Convolution weight ``[num_output, C_in/group, *k]``,
Deconvolution weight ``[C_in, num_output/group, *k]``, bias ``[num_output]``.
``axis`` selects the channel axis; the axes before it are flattened into the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import LayerSpec
from ..textformat import Message
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    converter,
    fail,
    integer,
    same_shapes,
)
from .fillers import fill_blobs

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DECONV = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _per_axis(layer: LayerSpec, p: Message, name: str, default: int, n: int) -> tuple[int, ...]:
    """A repeated ``name`` (1 value or one per spatial axis) or its ``name_h``/``name_w`` form."""
    values = p.getall(name)
    h, w = (f"{name.removesuffix('_size')}_{axis}" for axis in "hw")
    if p.has(h) or p.has(w):
        if values:
            raise fail(layer, f"give either {name} or {h}/{w}, not both")
        if n != 2 or not (p.has(h) and p.has(w)):
            raise fail(layer, f"{h} and {w} must be given together, and only for 2-D data")
        values = [p.get(h), p.get(w)]
    if not values:
        return (default,) * n
    if len(values) not in (1, n) or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values
    ):
        raise fail(layer, f"{name} needs 1 or {n} non-negative integers; got {values}")
    return tuple(values) * n if len(values) == 1 else tuple(values)


class Conv(CaffeLayer):
    bias: nn.Parameter | None  # registered with register_parameter (None without bias_term)

    def __init__(
        self,
        weight_shape: Shape,
        bias: bool,
        axis: int,
        stride: Shape,
        pad: Shape,
        dilation: Shape,
        groups: int,
        transposed: bool,
    ) -> None:
        super().__init__()
        num_output = weight_shape[1] * groups if transposed else weight_shape[0]
        self.add_weight_bias(weight_shape, num_output if bias else None)
        self.axis, self.stride, self.pad, self.dilation, self.groups = axis, stride, pad, dilation, groups
        self.fn = (_DECONV if transposed else _CONV)[len(stride)]

    def _one(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[: self.axis]
        y = self.fn(
            x.reshape(-1, *x.shape[self.axis :]),
            self.weight,
            self.bias,
            self.stride,
            self.pad,
            dilation=self.dilation,
            groups=self.groups,
        )
        return y.reshape(*lead, *y.shape[1:])

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Several bottoms share the weights: bottom i -> top i.
        return tuple(self._one(x) for x in xs)


def _geometry(
    layer: LayerSpec, p: Message, shape: Shape, sizes: Shape, transposed: bool = False
) -> tuple[Shape, Shape, Shape, Shape, Shape]:
    """Kernel, pad, stride and dilation per spatial axis (``sizes``: the input's spatial
    extent), and the output's spatial size by Caffe's formulas."""
    n = len(sizes)
    kernel = _per_axis(layer, p, "kernel_size", 0, n)
    if any(k <= 0 for k in kernel):
        raise fail(layer, f"needs kernel_size (or kernel_h and kernel_w) > 0; got {list(kernel)}")
    pad, stride = _per_axis(layer, p, "pad", 0, n), _per_axis(layer, p, "stride", 1, n)
    dilation = _per_axis(layer, p, "dilation", 1, n)
    if any(s <= 0 for s in stride) or any(d <= 0 for d in dilation):
        raise fail(layer, "stride and dilation must be positive")
    out = []
    for size, k, s, pd, d in zip(sizes, kernel, stride, pad, dilation, strict=True):
        extent = d * (k - 1) + 1
        out.append(s * (size - 1) + extent - 2 * pd if transposed else (size + 2 * pd - extent) // s + 1)
    if min(out) <= 0:
        raise fail(
            layer,
            f"input {list(shape)} is too small for kernel {list(kernel)}, pad {list(pad)}, "
            f"stride {list(stride)}, dilation {list(dilation)}",
        )
    return kernel, pad, stride, dilation, tuple(out)


@converter("Convolution", "Deconvolution", bottoms=(1, 99))
def convolution(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    if len(layer.tops) != len(shapes):
        raise fail(layer, f"needs one top per bottom; got {len(shapes)} bottoms and {len(layer.tops)} tops")
    same_shapes(layer, shapes)
    p = layer.sub("convolution_param")
    shape = shapes[0]
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shape))
    n = len(shape) - axis - 1
    if n not in (1, 2, 3):
        raise fail(
            layer, f"supports 1 to 3 spatial axes after the channel axis; input shape {list(shape)} has {n}"
        )
    transposed = layer.type == "Deconvolution"
    kernel, pad, stride, dilation, spatial = _geometry(layer, p, shape, shape[axis + 1 :], transposed)
    num_output, groups = integer(layer, p, "num_output"), integer(layer, p, "group", 1)
    channels = shape[axis]
    if num_output <= 0 or groups <= 0 or channels % groups or num_output % groups:
        raise fail(
            layer,
            f"input channels ({channels}) and num_output ({num_output}) must be positive "
            f"and divisible by group ({groups})",
        )
    w_shape = (
        (channels, num_output // groups, *kernel) if transposed else (num_output, channels // groups, *kernel)
    )
    bias = bool(p.get("bias_term", True))
    module = Conv(w_shape, bias, axis, stride, pad, dilation, groups, transposed)
    fill_blobs(layer, module, p)
    top = (*shape[:axis], num_output, *spatial)
    return Built(module, [top] * len(shapes))


class Im2col(CaffeLayer):
    """``im2col_layer.cpp``: each output position's receptive field as a column, (N, C·kh·kw, H', W').

    Rows are ordered channel, kernel row, kernel column — ``F.unfold``'s order, and the
    layout Convolution's weights multiply.
    """

    config = ("kernel", "stride", "pad", "dilation", "out")
    kernel: Shape
    stride: Shape
    pad: Shape
    dilation: Shape
    out: Shape

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        cols = F.unfold(x, self.kernel, dilation=self.dilation, padding=self.pad, stride=self.stride)
        return (cols.reshape(x.shape[0], cols.shape[1], *self.out),)


@converter("Im2col", bottoms=1, tops=1)
def im2col(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("convolution_param")
    shape = shapes[0]
    if len(shape) != 4 or int(p.get("axis", 1)) != 1:
        raise fail(layer, f"supports 2-D images (N, C, H, W) with axis 1; got shape {list(shape)}")
    kernel, pad, stride, dilation, out = _geometry(layer, p, shape, shape[2:])
    module = Im2col(kernel, stride, pad, dilation, out)
    return Built(module, [(shape[0], shape[1] * kernel[0] * kernel[1], *out)])
