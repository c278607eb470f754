"""A Siamese net (two branches sharing weights, ContrastiveLoss) trains on Fashion-MNIST pairs.

The loss layer reads two predicted blobs and the similarity label, so ``CaffeClassifier``
returns the pair of features and ``CaffeLoss`` puts the label back at its bottom.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparkdp.caffe.classifier import CaffeClassifier
from sparkdp.data import load_dataset
from sparkdp.data.tensors import TensorData

from .siamese import SOLVER, fashion_pairs, siamese_net


def _pairs(n_train: int, n_test: int):
    ds = load_dataset("fashion-mnist", limit=6000)
    as_bytes = lambda a: (a * 255).round().astype(np.uint8)  # noqa: E731 (the dataset scales to [0, 1])
    train = fashion_pairs(as_bytes(ds.x_train), ds.y_train, n_train)
    test = fashion_pairs(as_bytes(ds.x_test), ds.y_test, n_test, seed=1)
    return [TensorData(torch.from_numpy(p).float(), torch.from_numpy(s)) for p, s in (train, test)]


def test_siamese_model_returns_both_features_and_shares_weights():
    model = CaffeClassifier(siamese_net(), sample_shape=(2, 28, 28))
    assert model.prediction_blobs == ("feat", "feat_p") and model.label_blob == "sim"
    x = torch.rand(3, 2, 28, 28) * 255
    f, fp = model(x)
    # the branches share every weight: swapping the two images swaps the features
    g, gp = model(x.flip(1))
    torch.testing.assert_close((f, fp), (gp, g))
    loss = model.caffe_loss()(model(x), torch.tensor([1.0, 0.0, 1.0]))
    d2 = ((f - fp) ** 2).sum(1)
    hand = (d2[0] + torch.clamp(1 - d2[1].sqrt(), min=0) ** 2 + d2[2]) / 6
    torch.testing.assert_close(loss, hand)


@pytest.mark.spark
def test_siamese_net_trains_on_fashion_mnist_pairs(spark):
    from sparkdp.caffe.train import fit_caffe

    train, test = _pairs(4000, 1000)
    result = fit_caffe(siamese_net(), SOLVER, train, eval_data=test, workers=2, epochs=3, spark=spark,
                       show_progress=False)
    losses = [h["test_loss"] for h in result.history]
    assert losses[-1] < losses[0] and "test_accuracy" not in result.history[-1], result.history
    model = result.model.eval()
    with torch.no_grad():
        f, fp = model(test.features)
    distance = (f - fp).norm(dim=1)
    similar = test.labels == 1
    # same-class pairs end up closer than different-class ones: thresholding at margin/2 separates them
    assert distance[similar].mean() < 0.6 * distance[~similar].mean()
    assert ((distance < 0.5) == similar).float().mean() > 0.7
