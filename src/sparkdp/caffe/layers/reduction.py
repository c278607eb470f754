"""Reduction (``reduction_layer.cpp``): SUM, ASUM, SUMSQ or MEAN over every axis from ``axis`` on.

The top keeps the axes before ``axis`` (a scalar for the default ``axis: 0``) and is
multiplied by ``coeff``; a loss can be built from it with ``loss_weight``.
"""

from __future__ import annotations

import torch

from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    converter,
    enum,
    number,
)

# ReductionParameter.ReductionOp numbers from 1: SUM = 1, ASUM = 2, SUMSQ = 3, MEAN = 4.
_OPS = ("", "SUM", "ASUM", "SUMSQ", "MEAN")


class Reduction(CaffeLayer):
    config = ("op", "axis", "coeff")
    op: str
    axis: int
    coeff: float

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        rows = x.reshape(*x.shape[: self.axis], -1)
        if self.op == "ASUM":
            rows = rows.abs()
        elif self.op == "SUMSQ":
            rows = rows * rows
        out = rows.mean(dim=-1) if self.op == "MEAN" else rows.sum(dim=-1)
        return (out * self.coeff if self.coeff != 1.0 else out,)


@converter("Reduction", bottoms=1, tops=1)
def reduction(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("reduction_param")
    op = enum(layer, p, "operation", "SUM", _OPS)
    axis = canonical_axis(layer, int(p.get("axis", 0)), len(shapes[0]))
    return Built(Reduction(op or "SUM", axis, number(layer, p, "coeff", 1.0)), [shapes[0][:axis]])
