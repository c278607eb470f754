"""InnerProduct (``inner_product_layer.cpp``): a fully connected layer over trailing axes.

``K = count(axis:)`` (row-major C, H, W flattening), weight ``[N, K]`` like
``nn.Linear`` (``[K, N]`` with ``transpose: true``), top ``bottom.shape[:axis] + [N]``.
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
    count,
    fail,
    flag,
    integer,
)
from .fillers import fill_blobs


class InnerProduct(CaffeLayer):
    bias: nn.Parameter | None  # registered with register_parameter (None without bias_term)

    def __init__(self, k: int, n: int, axis: int, bias: bool, transpose: bool) -> None:
        super().__init__()
        self.add_weight_bias((k, n) if transpose else (n, k), n if bias else None)
        self.axis, self.transpose = axis, transpose

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        flat = x.flatten(self.axis) if self.axis < x.dim() else x.unsqueeze(-1)
        weight = self.weight.t() if self.transpose else self.weight
        return (F.linear(flat, weight, self.bias),)


@converter("InnerProduct", bottoms=1, tops=1)
def inner_product(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("inner_product_param")
    shape = shapes[0]
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shape))
    n = integer(layer, p, "num_output")
    if n <= 0:
        raise fail(layer, f"num_output must be positive; got {n}")
    bias = flag(layer, p, "bias_term", True)
    module = InnerProduct(count(shape, axis), n, axis, bias, flag(layer, p, "transpose", False))
    fill_blobs(layer, module, p)
    return Built(module, [(*shape[:axis], n)])
