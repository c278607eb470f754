"""LRN, BatchNorm, Scale, Bias and MVN with Caffe's exact semantics.

BatchNorm keeps Caffe's three blobs as buffers (mean accumulator, variance
accumulator, scale factor), because Caffe's running estimate is an EMA normalised by
that factor, which ``nn.BatchNorm2d``'s momentum only matches asymptotically.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    converter,
    enum,
    fail,
    flag,
    integer,
    number,
)
from .fillers import fill_


class LRN(CaffeLayer):
    config = ("size", "alpha", "beta", "k", "across")
    size: int
    alpha: float
    beta: float
    k: float
    across: bool

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        if self.across:  # x_c (k + alpha/n Σ x_c'^2)^-beta, zero outside [0, C)
            return (F.local_response_norm(x, self.size, self.alpha, self.beta, self.k),)
        # WITHIN_CHANNEL: Caffe chains AVE pooling of x² (divisor n², padding counted) and
        # Power(shift 1, scale alpha, power -beta); ``k`` is ignored there.
        avg = F.avg_pool2d(x * x, self.size, 1, (self.size - 1) // 2, count_include_pad=True)
        return (x * (1.0 + self.alpha * avg) ** (-self.beta),)


@converter("LRN", bottoms=1, tops=1)
def lrn(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("lrn_param")
    size = integer(layer, p, "local_size", 5)
    if size <= 0 or size % 2 == 0:
        raise fail(layer, f"local_size must be odd and positive; got {size}")
    if len(shapes[0]) != 4:
        raise fail(layer, f"needs 4-D input (N, C, H, W); got shape {list(shapes[0])}")
    region = enum(layer, p, "norm_region", "ACROSS_CHANNELS", ("ACROSS_CHANNELS", "WITHIN_CHANNEL"))
    module = LRN(
        size,
        number(layer, p, "alpha", 1.0),
        number(layer, p, "beta", 0.75),
        number(layer, p, "k", 1.0),
        region == "ACROSS_CHANNELS",
    )
    return Built(module, [shapes[0]])


class BatchNorm(CaffeLayer):
    """Caffe's BatchNorm (no affine part; pair it with Scale).

    Batch statistics are used when ``use_global_stats`` is false, or when it is unset,
    the layer's phase is TRAIN and the module is in training mode; an explicit
    ``use_global_stats: true`` wins even in training (fine-tuning nets rely on it).
    """

    blob_names = ("mean_acc", "var_acc", "scale_factor")
    mean_acc: torch.Tensor
    var_acc: torch.Tensor
    scale_factor: torch.Tensor

    def __init__(
        self, channels: int, eps: float, fraction: float, use_global: bool | None, train: bool
    ) -> None:
        super().__init__()
        self.register_buffer("mean_acc", torch.zeros(channels))
        self.register_buffer("var_acc", torch.zeros(channels))
        self.register_buffer("scale_factor", torch.zeros(1))
        self.eps, self.fraction, self.use_global, self.train_phase = eps, fraction, use_global, train

    def uses_global_stats(self) -> bool:
        if self.use_global is not None:
            return self.use_global
        return not (self.train_phase and self.training)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        shape = x.shape
        x3 = x.reshape(shape[0], 1 if x.dim() == 1 else shape[1], -1)  # (N, C, spatial)
        view = (1, -1, 1)
        if self.uses_global_stats():
            s = self.scale_factor[0]
            factor = torch.where(s == 0, torch.zeros_like(s), 1.0 / s)
            mean, var = self.mean_acc * factor, self.var_acc * factor
        else:
            mean = x3.mean(dim=(0, 2))
            var = ((x3 - mean.view(view)) ** 2).mean(dim=(0, 2))  # biased batch variance
            self._accumulate(mean.detach(), var.detach(), x3.shape[0] * x3.shape[2])
        y = (x3 - mean.view(view)) / torch.sqrt(var.view(view) + self.eps)
        return (y.reshape(shape),)

    @torch.no_grad()
    def _accumulate(self, mean: torch.Tensor, var: torch.Tensor, m: int) -> None:
        self.scale_factor.mul_(self.fraction).add_(1.0)
        self.mean_acc.mul_(self.fraction).add_(mean)
        correction = m / (m - 1) if m > 1 else 1.0  # unbiased variance for the running estimate
        self.var_acc.mul_(self.fraction).add_(correction * var)


@converter("BatchNorm", bottoms=1, tops=1)
def batch_norm(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    bad = [p.lr_mult for p in layer.params if p.lr_mult not in (None, 0, 0.0)]
    if bad or len(layer.params) > 3:
        raise fail(
            layer, "BatchNorm's 3 statistics blobs are not learned: give no param {} or three with lr_mult: 0"
        )
    p = layer.sub("batch_norm_param")
    shape = shapes[0]
    use_global = flag(layer, p, "use_global_stats", False) if p.has("use_global_stats") else None
    module = BatchNorm(
        1 if len(shape) == 1 else shape[1],
        number(layer, p, "eps", 1e-5),
        number(layer, p, "moving_average_fraction", 0.999),
        use_global,
        (layer.phase or ctx.phase) == "TRAIN",
    )
    return Built(module, [shape])


class ScaleBias(CaffeLayer):
    """``y = x ⊙ γ (+ β)`` (Scale) or ``y = x + β`` (Bias), broadcast from ``axis``."""

    def __init__(
        self, axis: int, scale_shape: Shape | None, bias_shape: Shape | None, second: str = ""
    ) -> None:
        super().__init__()
        self.second = second  # what a second bottom supplies: "weight" (Scale), "bias" (Bias) or ""
        names = []
        if scale_shape is not None:
            self.weight = nn.Parameter(torch.zeros(scale_shape))
            names.append("weight")
        if bias_shape is not None:
            self.bias = nn.Parameter(torch.zeros(bias_shape))
            names.append("bias")
        self.blob_names = tuple(names)
        self.axis = axis

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return t.reshape(*t.shape, *([1] * (x.dim() - self.axis - t.dim())))

    def forward(self, x: torch.Tensor, other: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        scale = other if self.second == "weight" else getattr(self, "weight", None)
        bias = other if self.second == "bias" else getattr(self, "bias", None)
        y = x if scale is None else x * self._view(scale, x)
        return (y if bias is None else y + self._view(bias, x),)


@converter("Scale", "Bias", bottoms=(1, 2), tops=1)
def scale_bias(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    is_scale = layer.type == "Scale"
    p = layer.sub("scale_param" if is_scale else "bias_param")
    shape = shapes[0]
    if len(shapes) == 2:
        given = shapes[1]
        axis = 0 if not given else canonical_axis(layer, int(p.get("axis", 1)), len(shape))
        if tuple(shape[axis : axis + len(given)]) != tuple(given):
            raise fail(
                layer,
                f"second bottom {layer.bottoms[1]!r} has shape {list(given)}, which must equal "
                f"the first bottom's dims {list(shape[axis : axis + len(given)])} "
                f"(shape {list(shape)}, axis {axis})",
            )
        learned: Shape | None = None
    else:
        axis = canonical_axis(layer, int(p.get("axis", 1)), len(shape)) if shape else 0
        num_axes = integer(layer, p, "num_axes", 1)
        if num_axes < -1 or (num_axes >= 0 and axis + num_axes > len(shape)):
            raise fail(layer, f"num_axes {num_axes} from axis {axis} does not fit input shape {list(shape)}")
        learned = tuple(shape[axis:] if num_axes == -1 else shape[axis : axis + num_axes])
    param_shape = learned if learned is not None else tuple(shapes[1])
    where = f"{layer.describe()}: "
    if is_scale:
        has_bias = flag(layer, p, "bias_term", False)
        module = ScaleBias(
            axis, learned, param_shape if has_bias else None, "" if learned is not None else "weight"
        )
        if learned is not None:
            fill_(module.weight, p.get("filler"), default_value=1.0, where=where)
        if has_bias:
            fill_(module.bias, p.get("bias_filler"), where=where)
    else:
        module = ScaleBias(axis, None, learned, "" if learned is not None else "bias")
        if learned is not None:
            fill_(module.bias, p.get("filler"), where=where)
    return Built(module, [shape])


class MVN(CaffeLayer):
    """Mean-variance normalisation per (n, c) plane, or per sample with ``across_channels``.

    ``(x - mean) / (sqrt(var) + eps)`` with the biased variance and ``eps`` added after
    the square root (``mvn_layer.cpp``), unlike BatchNorm's ``sqrt(var + eps)``.
    """

    config = ("normalize_variance", "across_channels", "eps")
    normalize_variance: bool
    across_channels: bool
    eps: float

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        rows = (
            x.reshape(x.shape[0], -1)
            if self.across_channels or x.dim() < 2
            else x.reshape(x.shape[0] * x.shape[1], -1)
        )
        centred = rows - rows.mean(dim=1, keepdim=True)
        if self.normalize_variance:
            std = (centred * centred).mean(dim=1, keepdim=True).sqrt()
            centred = centred / (std + self.eps)
        return (centred.reshape(x.shape),)


@converter("MVN", bottoms=1, tops=1)
def mvn(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("mvn_param")
    module = MVN(
        flag(layer, p, "normalize_variance", True),
        flag(layer, p, "across_channels", False),
        number(layer, p, "eps", 1e-9),
    )
    return Built(module, [shapes[0]])
