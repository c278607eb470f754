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

from .siamese import SOLVER, fashion_pairs, siamese_net


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


@pytest.mark.e2e
@pytest.mark.slow  # (make test-all) LeNet through sparkdp train stays in make test
def test_siamese_net_trains_from_its_pair_lmdb_through_sparkdp_train(tmp_path):
    """BVLC's Siamese workflow: pairs stored as 2-channel Datums with the similarity as label."""
    import json

    from sparkdp.caffe.sources import write_datum_db
    from tests.cli.test_caffe_train import _explain, sparkdp

    ds = load_dataset("fashion-mnist", limit=6000)
    as_bytes = lambda a: (a * 255).round().astype(np.uint8)  # noqa: E731 (the dataset scales to [0, 1])
    for name, (x, y, n, seed) in {
        "pairs_train_lmdb": (ds.x_train, ds.y_train, 4000, 0),
        "pairs_test_lmdb": (ds.x_test, ds.y_test, 1000, 1),
    }.items():
        pairs, sim = fashion_pairs(as_bytes(x), y, n, seed=seed)
        write_datum_db(tmp_path / name, pairs, sim)
    (tmp_path / "siamese_train_test.prototxt").write_text(siamese_net())
    (tmp_path / "solver.prototxt").write_text(SOLVER)
    proc = sparkdp(
        "train",
        "--caffe-solver",
        "solver.prototxt",
        "--workers",
        "2",
        "--epochs",
        "3",
        "-q",
        "--json-out",
        "run.json",
        "--out",
        "out",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, _explain(proc)
    run = json.loads((tmp_path / "run.json").read_text())
    losses = [h["test_loss"] for h in run["history"]]
    assert losses[-1] < 0.9 * losses[0] and "test_accuracy" not in run["history"][-1], run["history"]
    # the trained weights: same-class pairs end up closer than different-class ones
    from sparkdp.caffe import load_weights

    model = CaffeClassifier(siamese_net(), sample_shape=(2, 28, 28))
    load_weights(model, tmp_path / "out" / "model.caffemodel")
    test_pairs, test_sim = fashion_pairs(as_bytes(ds.x_test), ds.y_test, 1000, seed=1)
    with torch.no_grad():
        f, fp = model.eval()(torch.from_numpy(test_pairs).float())
    distance = (f - fp).norm(dim=1)
    similar = torch.from_numpy(test_sim) == 1
    assert distance[similar].mean() < 0.6 * distance[~similar].mean()
    assert ((distance < 0.5) == similar).float().mean() > 0.7
