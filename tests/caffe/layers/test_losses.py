"""Softmax, SoftmaxWithLoss, SigmoidCrossEntropyLoss, EuclideanLoss, Accuracy, MultinomialLogisticLoss, InfogainLoss."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from sparkdp.errors import ConfigError, DataError

SCORES = torch.tensor([[2.0, 1.0, 0.1], [0.5, 2.5, 0.0], [1.0, 1.0, 3.0], [0.0, 0.0, 0.0]])
LABELS = torch.tensor([0.0, 2.0, 255.0, 1.0])


def _softmax_loss(build, loss_param="", tops='top: "loss"'):
    return build(
        f'layer {{ name: "l" type: "SoftmaxWithLoss" bottom: "x" bottom: "t" {tops} '
        f"loss_param {{ {loss_param} }} }}",
        x=(4, 3),
        t=(4,),
    )


def _nll(scores, labels):
    return [
        -math.log(math.exp(s[int(t)]) / sum(math.exp(v) for v in s))
        for s, t in zip(scores.tolist(), labels, strict=True)
    ]


@pytest.mark.parametrize(
    ("param", "divisor"),
    [
        ("ignore_label: 255", 3),  # VALID (default) = non-ignored count
        ("ignore_label: 255 normalization: FULL", 4),
        ("ignore_label: 255 normalization: BATCH_SIZE", 4),
        ("ignore_label: 255 normalization: NONE", 1),
        ("ignore_label: 255 normalize: false", 4),  # deprecated: false -> BATCH_SIZE
        ("ignore_label: 255 normalize: true", 3),
    ],
)
def test_softmax_with_loss_normalizations(build, param, divisor):
    net = _softmax_loss(build, param)
    terms = _nll(SCORES[[0, 1, 3]], [0, 2, 1])
    assert net(SCORES, LABELS).item() == pytest.approx(sum(terms) / divisor, rel=1e-6)


def test_softmax_with_loss_matches_cross_entropy_and_spatial(build):
    net = _softmax_loss(build, "", tops='top: "loss" top: "prob" loss_weight: 1 loss_weight: 0')
    labels = torch.tensor([0.0, 2.0, 1.0, 1.0])
    out = net(SCORES, labels)
    torch.testing.assert_close(out["loss"], F.cross_entropy(SCORES, labels.long()))
    torch.testing.assert_close(out["prob"], F.softmax(SCORES, 1))
    assert net.loss_weights == {"loss": 1.0}
    spatial = build(
        'layer { name: "l" type: "SoftmaxWithLoss" bottom: "x" bottom: "t" top: "loss" }',
        x=(2, 3, 2, 2),
        t=(2, 1, 2, 2),
    )
    x, t = torch.randn(2, 3, 2, 2), torch.randint(0, 3, (2, 1, 2, 2)).float()
    torch.testing.assert_close(spatial(x, t), F.cross_entropy(x, t[:, 0].long()))


def test_softmax_loss_all_ignored_is_zero_and_bad_labels(build):
    net = _softmax_loss(build, "ignore_label: 255")
    assert net(SCORES, torch.full((4,), 255.0)).item() == 0.0  # torch's mean would give NaN
    with pytest.raises(DataError, match=r"labels must lie in \[0, 3\)"):
        net(SCORES, torch.tensor([0.0, 3.0, 1.0, 1.0]))


def test_softmax_loss_clamps_value_like_caffe(build):
    net = _softmax_loss(build)
    x = torch.tensor([[200.0, 0.0, 0.0]] * 4, requires_grad=True)
    loss = net(x, torch.ones(4))
    assert loss.item() == pytest.approx(-math.log(1.1754943508222875e-38), rel=1e-6)  # log(max(p, FLT_MIN))
    loss.backward()
    torch.testing.assert_close(x.grad, (F.softmax(x, 1) - F.one_hot(torch.ones(4).long(), 3)).detach() / 4)


def test_softmax_axis(build):
    net = build(
        'layer { name: "s" type: "Softmax" bottom: "x" top: "y" softmax_param { axis: 0 } }', x=(3, 2)
    )
    x = torch.randn(3, 2)
    torch.testing.assert_close(net(x), torch.softmax(x, 0))


def test_sigmoid_cross_entropy_default_batch_size(build):
    x, t = torch.randn(4, 5), (torch.rand(4, 5) > 0.5).float()
    net = build(
        'layer { name: "l" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "loss" }',
        x=(4, 5),
        t=(4, 5),
    )
    manual = -(t * torch.log(torch.sigmoid(x)) + (1 - t) * torch.log(1 - torch.sigmoid(x))).sum() / 4
    torch.testing.assert_close(net(x, t), manual)
    t[0, 0] = -1
    valid = build(
        'layer { name: "l" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "loss" '
        "loss_param { ignore_label: -1 normalization: VALID } }",
        x=(4, 5),
        t=(4, 5),
    )
    per = F.binary_cross_entropy_with_logits(x, t.clamp(min=0), reduction="none")
    torch.testing.assert_close(valid(x, t), (per.sum() - per[0, 0]) / 19)


def test_euclidean_loss(build):
    net = build(
        'layer { name: "l" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "loss" }', a=(3, 2), b=(3, 2)
    )
    a, b = torch.randn(3, 2), torch.randn(3, 2)
    torch.testing.assert_close(net(a, b), ((a - b) ** 2).sum() / 6)
    assert net.loss_weights == {"loss": 1.0}


def test_accuracy_ties_top_k_ignore_and_per_class(build):
    scores = torch.tensor(
        [[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 2.0, 1.0], [0.0, 1.0, 2.0], [5.0, 0.0, 0.0]]
    )
    labels = torch.tensor([0.0, 2.0, 2.0, 2.0, 9.0])
    text = (
        'layer {{ name: "a" type: "Accuracy" bottom: "x" bottom: "t" top: "acc" {} '
        "accuracy_param {{ ignore_label: 9 {} }} }}"
    )
    top1 = build(text.format('top: "per_class"', ""), x=(5, 3), t=(5,))
    out = top1(scores, labels)
    # row 0: tie with class 1 counts as an error; rows 1, 2 wrong; row 3 right; row 4 ignored.
    assert out["acc"].item() == pytest.approx(1 / 4)
    assert out["per_class"].tolist() == pytest.approx([0.0, 0.0, 1 / 3])  # class 1 never appears: 0
    assert top1.loss_weights == {}
    top2 = build(text.format("", "top_k: 2"), x=(5, 3), t=(5,))
    # top 2: row 0 (one other class >=) and row 1 are right now; row 2 has two better classes.
    assert top2(scores, labels).item() == pytest.approx(3 / 4)
    assert top2(scores, torch.full((5,), 9.0)).item() == 0.0


def test_multinomial_logistic_loss_is_nll_of_probabilities(build):
    net = build(
        'layer { name: "l" type: "MultinomialLogisticLoss" bottom: "p" bottom: "t" top: "loss" }',
        p=(4, 3),
        t=(4,),
    )
    prob = F.softmax(SCORES, 1)
    labels = torch.tensor([0.0, 2.0, 1.0, 1.0])
    torch.testing.assert_close(net(prob, labels), F.nll_loss(torch.log(prob), labels.long()))
    zero = torch.tensor([[1.0, 0.0, 0.0]] * 4)  # p = 0 at the label: log is clamped at 1e-20
    assert net(zero, torch.tensor([1.0, 0.0, 0.0, 0.0])).item() == pytest.approx(-math.log(1e-20) / 4)


def _infogain(build, extra="", **shapes):
    bottoms = "".join(f'bottom: "{name}" ' for name in shapes)
    return build(f'layer {{ name: "l" type: "InfogainLoss" {bottoms} top: "loss" {extra} }}', **shapes)


def test_infogain_loss_identity_is_softmax_loss_and_general_h(build, tmp_path):
    from sparkdp.caffe.caffemodel import encode_blob_proto

    labels = torch.tensor([0.0, 2.0, 1.0, 1.0])
    net = _infogain(build, x=(4, 3), t=(4,), h=(1, 1, 3, 3))
    torch.testing.assert_close(net(SCORES, labels, torch.eye(3)), F.cross_entropy(SCORES, labels.long()))
    h = torch.tensor([[1.0, 0.5, 0.0], [0.0, 2.0, 0.0], [0.25, 0.0, 1.0]])
    expected = -(h[labels.long()] * F.log_softmax(SCORES, 1)).sum(1).mean()
    torch.testing.assert_close(net(SCORES, labels, h), expected)
    # H from a BlobProto file, and ignore_label with the default VALID normalisation
    (tmp_path / "H.binaryproto").write_bytes(encode_blob_proto(h.numpy().reshape(1, 1, 3, 3)))
    net = _infogain(
        build,
        f'infogain_loss_param {{ source: "{tmp_path / "H.binaryproto"}" }} loss_param {{ ignore_label: 1 }}',
        x=(4, 3),
        t=(4,),
    )
    kept = -(h[labels.long()] * F.log_softmax(SCORES, 1)).sum(1)[:2].mean()
    torch.testing.assert_close(net(SCORES, labels), kept)


def test_infogain_loss_errors(build, tmp_path):
    with pytest.raises(ConfigError, match="needs the H matrix"):
        _infogain(build, x=(4, 3), t=(4,))
    with pytest.raises(ConfigError, match=r"bottom H has shape \[2, 2\]; it must hold 3x3"):
        _infogain(build, x=(4, 3), t=(4,), h=(2, 2))
    with pytest.raises(ConfigError, match="cannot read BlobProto file"):
        _infogain(build, f'infogain_loss_param {{ source: "{tmp_path / "nope"}" }}', x=(4, 3), t=(4,))


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ('type: "Softmax" bottom: "x" bottom: "t" top: "y"', "needs 1 bottom blob(s), got 2"),
        ('type: "SoftmaxWithLoss" bottom: "x" top: "y"', "needs 2 bottom blob(s), got 1"),
        ('type: "SoftmaxWithLoss" bottom: "x" bottom: "t"', "needs 1 to 2 top blob(s), got 0"),
    ],
)
def test_converters_check_their_blob_counts_first(build, layer, message):
    with pytest.raises(ConfigError, match=r"layer 'l' \(type \w+\): " + re.escape(message)):
        build(f'layer {{ name: "l" {layer} }}', x=(4, 3), t=(4,))
