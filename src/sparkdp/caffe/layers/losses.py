"""Softmax, the loss layers and Accuracy, normalised exactly as Caffe does.

Loss tops are scalars (Caffe's 0-axis blobs).  Labels arrive as float tensors (Caffe
stores them that way) and are truncated to integers like ``static_cast<int>``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..spec import LayerSpec
from .base import (
    FLT_MIN,
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    canonical_axis,
    check_range,
    converter,
    count,
    enum,
    expect_bottoms,
    expect_tops,
    fail,
    flag,
    integer,
    one_label_per_row,
)

_NORMALIZATIONS = ("FULL", "VALID", "BATCH_SIZE", "NONE")
_LOG_FLT_MIN = math.log(FLT_MIN)


def _rows(x: torch.Tensor, axis: int) -> torch.Tensor:
    """(outer·inner, C) with row index ``i·inner + j``, matching Caffe's label layout."""
    return x.movedim(axis, -1).reshape(-1, x.shape[axis])


def _labels(
    label: torch.Tensor, ignore: int | None, classes: int, who: str
) -> tuple[torch.Tensor, torch.Tensor]:
    lab = label.reshape(-1).long()
    valid = lab != ignore if ignore is not None else torch.ones_like(lab, dtype=torch.bool)
    safe = torch.where(valid, lab, torch.zeros_like(lab))
    check_range(safe, classes, who, "labels", " (or equal ignore_label)")  # ignored labels are 0 in safe
    return safe, valid


def _normalizer(mode: str, outer: int, inner: int, valid: torch.Tensor) -> torch.Tensor:
    if mode == "VALID":
        value = valid.sum().to(torch.float32)
    else:
        value = torch.tensor(float({"FULL": outer * inner, "BATCH_SIZE": outer, "NONE": 1}[mode]))
    return torch.clamp(value, min=1.0).to(valid.device)  # Caffe: max(1, normalizer)


def _loss_normalization(layer: LayerSpec, default: str) -> str:
    p = layer.sub("loss_param")
    if p.has("normalization"):
        return enum(layer, p, "normalization", default, _NORMALIZATIONS)
    if p.has("normalize"):  # deprecated bool
        return "VALID" if flag(layer, p, "normalize", True) else "BATCH_SIZE"
    return default


def _ignore(layer: LayerSpec, msg_name: str) -> int | None:
    p = layer.sub(msg_name)
    return integer(layer, p, "ignore_label") if p.has("ignore_label") else None


def _check_labels(layer: LayerSpec, shapes: list[Shape], axis: int) -> None:
    scores, label = shapes
    expected = count(scores, 0, axis) * count(scores, axis + 1)
    if count(label) != expected:
        raise fail(
            layer,
            f"label blob {layer.bottoms[1]!r} has shape {list(label)} ({count(label)} values) but "
            f"scores of shape {list(scores)} need {expected} labels (outer × inner)",
        )


class Softmax(CaffeLayer):
    config = ("axis",)
    axis: int

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        return (F.softmax(x, dim=self.axis),)


@converter("Softmax", bottoms=1, tops=1)
def softmax(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    axis = canonical_axis(layer, int(layer.sub("softmax_param").get("axis", 1)), len(shapes[0]))
    return Built(Softmax(axis), [shapes[0]])


class SoftmaxWithLoss(CaffeLayer):
    def __init__(self, axis: int, ignore: int | None, normalization: str, who: str, with_prob: bool) -> None:
        super().__init__()
        self.axis, self.ignore, self.normalization, self.who = axis, ignore, normalization, who
        self.with_prob = with_prob  # optional second top: the probabilities

    def forward(self, x: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logp = _rows(F.log_softmax(x, dim=self.axis), self.axis)
        safe, valid = _labels(label, self.ignore, x.shape[self.axis], self.who)
        picked = logp.gather(1, safe[:, None])[:, 0]
        # Caffe takes log(max(p, FLT_MIN)) but its gradient stays p - 1: clamp the value only.
        picked = picked + (picked.clamp(min=_LOG_FLT_MIN) - picked).detach()
        total = -(picked * valid).sum()
        outer = math.prod(x.shape[: self.axis])
        loss = total / _normalizer(self.normalization, outer, logp.shape[0] // max(outer, 1), valid)
        return (loss, F.softmax(x, dim=self.axis)) if self.with_prob else (loss,)


@converter("SoftmaxWithLoss", bottoms=2, tops=(1, 2))
def softmax_with_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    axis = canonical_axis(layer, int(layer.sub("softmax_param").get("axis", 1)), len(shapes[0]))
    _check_labels(layer, shapes, axis)
    module = SoftmaxWithLoss(
        axis,
        _ignore(layer, "loss_param"),
        _loss_normalization(layer, "VALID"),
        layer.describe(),
        len(layer.tops) == 2,
    )
    return Built(module, [(), shapes[0]][: len(layer.tops)])


class SigmoidCrossEntropyLoss(CaffeLayer):
    config = ("ignore", "normalization")
    ignore: int | None
    normalization: str

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor]:
        target = target.reshape(x.shape).to(x.dtype)
        per = F.binary_cross_entropy_with_logits(x, target, reduction="none")
        valid = (
            target.long() != self.ignore
            if self.ignore is not None
            else torch.ones_like(per, dtype=torch.bool)
        )
        outer = x.shape[0]
        norm = _normalizer(self.normalization, outer, x.numel() // max(outer, 1), valid)
        return ((per * valid).sum() / norm,)


@converter("SigmoidCrossEntropyLoss", bottoms=2, tops=1)
def sigmoid_cross_entropy_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    if count(shapes[0]) != count(shapes[1]):
        raise fail(layer, f"inputs need the same count; got shapes {list(shapes[0])} and {list(shapes[1])}")
    # Unlike SoftmaxWithLoss, the default here is BATCH_SIZE.
    module = SigmoidCrossEntropyLoss(_ignore(layer, "loss_param"), _loss_normalization(layer, "BATCH_SIZE"))
    return Built(module, [()])


class EuclideanLoss(CaffeLayer):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        diff = a - b.reshape(a.shape)
        return ((diff * diff).sum() / (2.0 * a.shape[0]),)


@converter("EuclideanLoss", bottoms=2, tops=1)
def euclidean_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    if count(shapes[0]) != count(shapes[1]):
        raise fail(layer, f"inputs need the same count; got shapes {list(shapes[0])} and {list(shapes[1])}")
    return Built(EuclideanLoss(), [()])


class Accuracy(CaffeLayer):
    """Correct iff fewer than ``top_k`` other classes score >= the true class (ties are errors)."""

    config = ("top_k", "axis", "ignore", "per_class", "who")
    top_k: int
    axis: int
    ignore: int | None
    per_class: bool
    who: str

    @torch.no_grad()
    def forward(self, x: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores = _rows(x, self.axis)
        classes = scores.shape[1]
        safe, valid = _labels(label, self.ignore, classes, self.who)
        true = scores.gather(1, safe[:, None])
        better = (scores >= true).sum(dim=1) - 1  # the true class counts itself once
        correct = (better < self.top_k) & valid
        n_valid = valid.sum()
        acc = torch.where(n_valid > 0, correct.sum() / n_valid.clamp(min=1), torch.zeros((), device=x.device))
        out = [acc.to(x.dtype)]
        if self.per_class:
            totals = torch.zeros(classes, device=x.device).index_add_(0, safe, valid.float())
            hits = torch.zeros(classes, device=x.device).index_add_(0, safe, correct.float())
            out.append(
                torch.where(totals > 0, hits / totals.clamp(min=1), torch.zeros_like(totals)).to(x.dtype)
            )
        return tuple(out)


@converter("Accuracy", bottoms=2, tops=(1, 2))
def accuracy(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("accuracy_param")
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shapes[0]))
    top_k = integer(layer, p, "top_k", 1)
    if not 1 <= top_k <= shapes[0][axis]:
        raise fail(layer, f"top_k must be in [1, {shapes[0][axis]}] (the number of classes); got {top_k}")
    _check_labels(layer, shapes, axis)
    per_class = len(layer.tops) == 2
    module = Accuracy(top_k, axis, _ignore(layer, "accuracy_param"), per_class, layer.describe())
    return Built(module, [(), (shapes[0][axis],)][: len(layer.tops)])


LOG_THRESHOLD = 1e-20  # Caffe's kLOG_THRESHOLD (loss_layer.hpp): log(max(p, 1e-20))


class MultinomialLogisticLoss(CaffeLayer):
    """``-Σ log(max(p[n, label_n], 1e-20)) / N`` on probabilities (pair it with Softmax)."""

    config = ("who",)
    who: str

    def forward(self, prob: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor]:
        rows = prob.reshape(prob.shape[0], -1)
        safe, _ = _labels(label, None, rows.shape[1], self.who)
        picked = rows.gather(1, safe[:, None])[:, 0]
        return (-torch.log(picked.clamp(min=LOG_THRESHOLD)).sum() / prob.shape[0],)


@converter("MultinomialLogisticLoss", bottoms=2, tops=1)
def multinomial_logistic_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    one_label_per_row(layer, shapes)
    return Built(MultinomialLogisticLoss(layer.describe()), [()])


class InfogainLoss(CaffeLayer):
    """Softmax, then ``-Σ_n Σ_l H[label_n, l] · log(max(p[n, l], 1e-20)) / normalizer``.

    Since BVLC Caffe's 2017 rewrite the layer takes unnormalised scores and applies the
    softmax itself (like SoftmaxWithLoss); ``H`` is a third bottom or the ``source``
    BlobProto file, K × K for K classes.  With ``H = I`` it is SoftmaxWithLoss.
    """

    h: torch.Tensor | None  # the ``source`` matrix; None when H is the third bottom

    def __init__(
        self, axis: int, ignore: int | None, normalization: str, who: str, h: torch.Tensor | None
    ) -> None:
        super().__init__()
        self.axis, self.ignore, self.normalization, self.who = axis, ignore, normalization, who
        self.register_buffer("h", h, persistent=False)

    def forward(
        self, x: torch.Tensor, label: torch.Tensor, h: torch.Tensor | None = None
    ) -> tuple[torch.Tensor]:
        classes = x.shape[self.axis]
        if h is None:
            h = self.h
            assert h is not None, "the converter gives InfogainLoss a source H or a third bottom"
        h = h.reshape(classes, classes).to(x.dtype)
        logp = torch.log(_rows(F.softmax(x, dim=self.axis), self.axis).clamp(min=LOG_THRESHOLD))
        safe, valid = _labels(label, self.ignore, classes, self.who)
        per_row = -(h[safe] * logp).sum(dim=1)
        outer = math.prod(x.shape[: self.axis])
        norm = _normalizer(self.normalization, outer, logp.shape[0] // max(outer, 1), valid)
        return ((per_row * valid).sum() / norm,)


@converter("InfogainLoss")
def infogain_loss(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    from ..caffemodel import read_blob_proto  # the H matrix file is a BlobProto, like a mean file

    expect_bottoms(layer, shapes, 2, 3)
    expect_tops(layer, 1, 2)
    if len(layer.tops) == 2:
        raise fail(layer, "the optional probability top is not supported; add a Softmax layer for it")
    p = layer.sub("infogain_loss_param")
    axis = canonical_axis(layer, int(p.get("axis", 1)), len(shapes[0]))
    _check_labels(layer, shapes[:2], axis)
    classes = shapes[0][axis]
    h = None
    if len(shapes) == 3:
        if count(shapes[2]) != classes * classes:
            raise fail(
                layer, f"bottom H has shape {list(shapes[2])}; it must hold {classes}x{classes} values"
            )
    else:
        source = str(p.get("source", ""))
        if not source:
            raise fail(
                layer, "needs the H matrix: a third bottom or infogain_loss_param { source: 'H.binaryproto' }"
            )
        values = read_blob_proto(source)
        if values.size != classes * classes:
            raise fail(
                layer, f"H in {source!r} has {values.size} values; {classes} classes need {classes * classes}"
            )
        h = torch.as_tensor(values.reshape(classes, classes), dtype=torch.float32)
    module = InfogainLoss(
        axis, _ignore(layer, "loss_param"), _loss_normalization(layer, "VALID"), layer.describe(), h
    )
    return Built(module, [()])
