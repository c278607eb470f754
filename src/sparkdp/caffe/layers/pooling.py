"""Pooling and spatial pyramid pooling (SPP) with Caffe's exact geometry (``pooling_layer.cpp``).

Caffe rounds the output size up (CEIL, the default ``round_mode``), drops a last
window that would start in the right padding, and divides AVE sums by the window
size clipped to ``H + pad`` (padding counts, the ceil overhang does not).  PyTorch
cannot express every case (``pad > k/2``; with ``pad == 0`` and ``stride > k`` Caffe
emits a window lying wholly outside the input), so this module pads the input
explicitly and pools with padding 0, which reproduces Caffe's loops for all cases:
an empty MAX window yields ``-FLT_MAX`` and an empty AVE window ``0/0 = NaN``, as in Caffe.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..spec import LayerSpec
from ..textformat import Message
from .base import (
    FLT_MAX,
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    converter,
    enum,
    fail,
    flag,
)


def pooled_size(size: int, kernel: int, stride: int, pad: int, ceil: bool = True) -> int:
    """Caffe's output length along one axis (``PoolingLayer::Reshape``)."""
    span = (size + 2 * pad - kernel) / stride
    pooled = (math.ceil(span) if ceil else math.floor(span)) + 1
    if pad > 0 and (pooled - 1) * stride >= size + pad:
        pooled -= 1  # the last window must start inside the image or the left padding
    return pooled


def _window_sizes(size: int, pooled: int, kernel: int, stride: int, pad: int) -> torch.Tensor:
    """AVE divisor per output position: ``min(start + k, size + pad) - start``."""
    starts = torch.arange(pooled) * stride - pad
    return (torch.clamp(starts + kernel, max=size + pad) - starts).to(torch.float32)


class Pool(CaffeLayer):
    def __init__(
        self,
        method: str,
        kernel: Shape,
        stride: Shape,
        pad: Shape,
        ceil: bool,
        global_: bool,
        with_mask: bool,
    ) -> None:
        super().__init__()
        self.method, self.kernel, self.stride, self.pad = method, kernel, stride, pad
        self.ceil, self.global_, self.with_mask = ceil, global_, with_mask

    def geometry(self, h: int, w: int) -> tuple[Shape, Shape]:
        kernel = (h, w) if self.global_ else self.kernel
        pooled = tuple(
            pooled_size(s, k, st, p, self.ceil)
            for s, k, st, p in zip((h, w), kernel, self.stride, self.pad, strict=True)
        )
        return kernel, pooled

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, w = x.shape[2], x.shape[3]
        (kh, kw), (ph, pw) = self.geometry(h, w)
        (sh, sw), (pad_h, pad_w) = self.stride, self.pad
        # Padded extent that exactly covers every window: [-pad, (pooled-1)*stride - pad + k).
        right_h, right_w = (ph - 1) * sh + kh - pad_h - h, (pw - 1) * sw + kw - pad_w - w
        fill = -math.inf if self.method == "MAX" else 0.0
        xp = F.pad(x, (pad_w, max(right_w, 0), pad_h, max(right_h, 0)), value=fill)
        xp = xp[:, :, : (ph - 1) * sh + kh, : (pw - 1) * sw + kw]  # drop input no window reaches
        if self.method == "MAX":
            y, idx = F.max_pool2d(xp, (kh, kw), (sh, sw), return_indices=True)
            empty = torch.isneginf(y)
            y = torch.where(empty, torch.full_like(y, -FLT_MAX), y)  # nothing inside: Caffe's -FLT_MAX seed
            if not self.with_mask:
                return (y,)
            wp = xp.shape[3]
            mask = (idx // wp - pad_h) * w + (idx % wp - pad_w)  # index h*W + w within the input plane
            return y, torch.where(empty, torch.full_like(y, -1.0), mask.to(y.dtype))
        total = F.avg_pool2d(xp, (kh, kw), (sh, sw), divisor_override=1)
        divisor = _window_sizes(h, ph, kh, sh, pad_h)[:, None] * _window_sizes(w, pw, kw, sw, pad_w)[None, :]
        return (total / divisor.to(total),)


def _geometry(layer: LayerSpec, p: Message, name: str, default: int | None) -> tuple[int, int]:
    both = (p.has(f"{name}_h"), p.has(f"{name}_w"))
    field = "kernel_size" if name == "kernel" else name
    if any(both):
        if p.has(field) or not all(both):
            raise fail(layer, f"give {field} or both {name}_h and {name}_w")
        return int(p.get(f"{name}_h")), int(p.get(f"{name}_w"))
    if p.has(field):
        return (int(p.get(field)),) * 2
    if default is None:
        raise fail(layer, "needs kernel_size or kernel_h and kernel_w (or global_pooling: true)")
    return default, default


def _method_and_input(layer: LayerSpec, p: Message, shapes: list[Shape]) -> tuple[str, Shape]:
    method = enum(layer, p, "pool", "MAX", ("MAX", "AVE", "STOCHASTIC"))
    if method == "STOCHASTIC":
        raise fail(layer, "STOCHASTIC pooling is not supported (Caffe runs it on GPU only); use MAX or AVE")
    if len(shapes[0]) != 4:
        raise fail(layer, f"pools 4-D input (N, C, H, W) only; got shape {list(shapes[0])}")
    return method, shapes[0]


@converter("Pooling", bottoms=1, tops=(1, 2))
def pooling(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("pooling_param")
    method, shape = _method_and_input(layer, p, shapes)
    global_ = flag(layer, p, "global_pooling", False)
    pad, stride = _geometry(layer, p, "pad", 0), _geometry(layer, p, "stride", 1)
    if global_:
        if p.has("kernel_size") or p.has("kernel_h"):
            raise fail(layer, "global_pooling takes its kernel from the input; remove kernel_size")
        if pad != (0, 0) or stride != (1, 1):
            raise fail(layer, "global_pooling needs pad 0 and stride 1")
        kernel = (shape[2], shape[3])
    else:
        kernel = _geometry(layer, p, "kernel", None)
    if min(kernel) <= 0 or min(stride) <= 0:
        raise fail(
            layer, f"kernel and stride must be positive; got kernel {list(kernel)}, stride {list(stride)}"
        )
    if any(pd >= k for pd, k in zip(pad, kernel, strict=True)):
        raise fail(layer, f"pad {list(pad)} must be smaller than kernel {list(kernel)}")
    if len(layer.tops) == 2 and method != "MAX":
        raise fail(layer, "a second top (the argmax mask) exists for MAX pooling only")
    ceil = enum(layer, p, "round_mode", "CEIL", ("CEIL", "FLOOR")) == "CEIL"
    module = Pool(method, kernel, stride, pad, ceil, global_, len(layer.tops) == 2)
    _, pooled = module.geometry(shape[2], shape[3])
    if min(pooled) <= 0:
        raise fail(layer, f"input {list(shape)} is smaller than kernel {list(kernel)}")
    top = (shape[0], shape[1], *pooled)
    return Built(module, [top] * len(layer.tops))


class SPP(CaffeLayer):
    """Spatial pyramid pooling (``spp_layer.cpp``): level ``i`` pools into about 2^i × 2^i bins.

    Each level is a Caffe Pooling with ``kernel = ceil(H / bins)``, ``stride = kernel`` and
    ``pad = (kernel·bins - H + 1) // 2`` (per axis); the levels are flattened and concatenated,
    except with ``pyramid_height: 1``, whose top is the single level's (N, C, 1, 1).
    """

    config = ("levels",)
    levels: list[Pool]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        if len(self.levels) == 1:
            return self.levels[0](x)
        return (torch.cat([level(x)[0].flatten(1) for level in self.levels], dim=1),)


def _spp_level(method: str, h: int, w: int, bins: int) -> Pool:
    kernel = (math.ceil(h / bins), math.ceil(w / bins))
    pad = tuple((k * bins - size + 1) // 2 for k, size in zip(kernel, (h, w), strict=True))
    return Pool(method, kernel, kernel, pad, True, False, False)


@converter("SPP", bottoms=1, tops=1)
def spp(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("spp_param")
    method, shape = _method_and_input(layer, p, shapes)
    height = p.get("pyramid_height")
    if not isinstance(height, int) or isinstance(height, bool) or height <= 0:
        raise fail(layer, f"needs spp_param {{ pyramid_height: L }} with L >= 1; got {height!r}")
    levels = [_spp_level(method, shape[2], shape[3], 2**i) for i in range(height)]
    sizes = [level.geometry(shape[2], shape[3])[1] for level in levels]
    if height == 1:
        return Built(SPP(levels), [(shape[0], shape[1], *sizes[0])])
    return Built(SPP(levels), [(shape[0], sum(shape[1] * ph * pw for ph, pw in sizes))])
