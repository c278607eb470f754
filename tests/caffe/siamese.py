"""A Siamese net in the layout of BVLC Caffe's MNIST Siamese example, and Fashion-MNIST pairs for it.

The net (written here, not copied) has BVLC's structure: a Data layer yields ``pair_data``
(two images stacked as channels) and ``sim``; a Slice splits the pair; two LeNet-style
branches share their weights through named ``param``s; ContrastiveLoss compares the two
2-D features.  The branches are smaller than BVLC's so the tests stay fast.
"""

from __future__ import annotations

import numpy as np


def _branch(suffix: str) -> str:
    s = suffix
    return f"""
layer {{ name: "conv1{s}" type: "Convolution" bottom: "data{s}" top: "conv1{s}"
  param {{ name: "conv1_w" lr_mult: 1 }} param {{ name: "conv1_b" lr_mult: 2 }}
  convolution_param {{ num_output: 8 kernel_size: 5 stride: 1
    weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" }} }} }}
layer {{ name: "pool1{s}" type: "Pooling" bottom: "conv1{s}" top: "pool1{s}"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
layer {{ name: "ip1{s}" type: "InnerProduct" bottom: "pool1{s}" top: "ip1{s}"
  param {{ name: "ip1_w" lr_mult: 1 }} param {{ name: "ip1_b" lr_mult: 2 }}
  inner_product_param {{ num_output: 64 weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" }} }} }}
layer {{ name: "relu1{s}" type: "ReLU" bottom: "ip1{s}" top: "ip1{s}" }}
layer {{ name: "feat{s}" type: "InnerProduct" bottom: "ip1{s}" top: "feat{s}"
  param {{ name: "feat_w" lr_mult: 1 }} param {{ name: "feat_b" lr_mult: 2 }}
  inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" }} }} }}
"""


def siamese_net(
    train_source: str = "pairs_train_lmdb", test_source: str = "pairs_test_lmdb", batch_size: int = 64
) -> str:
    """The train/test prototxt; ``*_source`` name the pair databases (LMDB)."""
    data = "".join(
        f"""
layer {{ name: "pair_data" type: "Data" top: "pair_data" top: "sim" include {{ phase: {phase} }}
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: {batch_size} backend: LMDB }} }}"""
        for phase, source in (("TRAIN", train_source), ("TEST", test_source))
    )
    return (
        'name: "fashion_siamese_train_test"\n'
        + data
        + """
layer { name: "slice_pair" type: "Slice" bottom: "pair_data" top: "data" top: "data_p"
  slice_param { slice_dim: 1 slice_point: 1 } }"""
        + _branch("")
        + _branch("_p")
        + """
layer { name: "loss" type: "ContrastiveLoss" bottom: "feat" bottom: "feat_p" bottom: "sim" top: "loss"
  contrastive_loss_param { margin: 1 } }
"""
    )


SOLVER = """net: "siamese_train_test.prototxt"
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0
lr_policy: "inv"
gamma: 0.0001
power: 0.75
max_iter: 100
solver_mode: CPU
"""


def fashion_pairs(
    images: np.ndarray, labels: np.ndarray, n: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs (n, 2, 28, 28) of the images (uint8) and ``sim`` (1 = same class), half of them similar."""
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    first = rng.integers(0, len(labels), n)
    sim = (np.arange(n) % 2 == 0).astype(np.int64)
    second = np.empty(n, dtype=np.int64)
    for i, (a, same) in enumerate(zip(first, sim)):
        pool = by_class[labels[a]] if same else np.flatnonzero(labels != labels[a])
        second[i] = pool[rng.integers(0, len(pool))]
    pairs = np.stack([images[first].reshape(n, 28, 28), images[second].reshape(n, 28, 28)], axis=1)
    return pairs, sim
