"""The margin losses: ContrastiveLoss (Siamese nets) and HingeLoss (one-vs-all SVM).

Both are normalised by the batch size N only, as Caffe's ``contrastive_loss_layer.cpp``
and ``hinge_loss_layer.cpp`` do.  ContrastiveLoss's gradient is Caffe's, not autograd's
of the written formula: Caffe divides by ``d + 1e-4``, so a dissimilar pair with identical
features gets a zero gradient instead of autograd's NaN (``d/dd sqrt`` at 0).
"""

from __future__ import annotations

import torch

from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    check_range,
    converter,
    count,
    enum,
    fail,
    flag,
    number,
    one_label_per_row,
)


class ContrastiveLoss(CaffeLayer):
    """``1/(2N) Σ [ y d² + (1-y) max(margin - d, 0)² ]`` with ``d = ‖a - b‖``.

    ``legacy_version`` uses ``max(margin - d², 0)`` for dissimilar pairs instead.
    ``y`` is truncated to an integer; nonzero means similar.
    """

    config = ("margin", "legacy")
    margin: float
    legacy: bool

    def forward(self, a: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        n = a.shape[0]
        diff = a.reshape(n, -1) - b.reshape(n, -1)
        dist_sq = (diff * diff).sum(dim=1)
        similar = y.reshape(n).to(torch.int64) != 0
        if self.legacy:
            dissimilar = torch.clamp(self.margin - dist_sq, min=0.0)
        else:
            dist = torch.sqrt(dist_sq.detach())
            mdist = torch.clamp(self.margin - dist, min=0.0)
            # value mdist², gradient -2·mdist/(d + 1e-4)·diff as in Caffe's Backward_cpu
            dissimilar = mdist**2 - (mdist / (dist + 1e-4)) * (dist_sq - dist_sq.detach())
        per_pair = torch.where(similar, dist_sq, dissimilar)
        return (per_pair.sum() / (2.0 * n),)


@converter("ContrastiveLoss", bottoms=3, tops=1)
def contrastive_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    a, b, y = shapes
    if a[0] != b[0] or count(a, 1) != count(b, 1):
        raise fail(layer, f"the two feature bottoms need equal shapes; got {list(a)} and {list(b)}")
    if count(y) != a[0]:
        raise fail(layer, f"needs one similarity label per pair: {a[0]} pairs but label shape {list(y)}")
    p = layer.sub("contrastive_loss_param")
    module = ContrastiveLoss(number(layer, p, "margin", 1.0), flag(layer, p, "legacy_version", False))
    return Built(module, [()])


class HingeLoss(CaffeLayer):
    """``1/N Σ_n Σ_k max(0, 1 - δ(l_n = k) x_nk)^p`` with δ = +1 for the true class, -1 otherwise."""

    config = ("squared", "who")
    squared: bool
    who: str

    def forward(self, x: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor]:
        rows = x.reshape(x.shape[0], -1)
        lab = label.reshape(-1, 1).to(torch.int64)
        check_range(lab, rows.shape[1], self.who, "labels")
        sign = torch.ones_like(rows)
        sign.scatter_(1, lab, -1.0)
        margins = torch.clamp(1.0 + sign * rows, min=0.0)
        total = (margins * margins).sum() if self.squared else margins.sum()
        return (total / x.shape[0],)


@converter("HingeLoss", bottoms=2, tops=1)
def hinge_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    one_label_per_row(layer, shapes)
    norm = enum(layer, layer.sub("hinge_loss_param"), "norm", "L1", ("", "L1", "L2"))  # proto enum: L1 = 1
    return Built(HingeLoss(norm == "L2", layer.describe()), [()])
