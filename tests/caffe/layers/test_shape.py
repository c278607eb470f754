"""caffe/layers/shape.py: Reshape, ArgMax and Tile."""

from __future__ import annotations

import pytest
import torch

from sparkdp.caffe.layers.shape import reshaped
from sparkdp.errors import ConfigError


@pytest.mark.parametrize(
    ("dims", "axis", "num_axes", "bottom", "top"),
    [
        ((0, -1), 0, -1, (2, 3, 4), (2, 12)),
        ((0, 0, 2, -1), 0, -1, (2, 3, 4), (2, 3, 2, 2)),
        ((-1,), 1, -1, (2, 3, 4), (2, 12)),
        ((3, 2), 1, 1, (2, 6, 4), (2, 3, 2, 4)),
        ((1, 1), -1, 0, (2, 3), (2, 3, 1, 1)),  # axis -1 with num_axes 0 inserts at the end
        ((1,), 0, 0, (2, 3), (1, 2, 3)),
        ((6,), 0, 2, (2, 3, 2), (6, 2)),
    ],
)
def test_reshape_semantics(build, dims, axis, num_axes, bottom, top):
    assert reshaped(dims, bottom, axis, num_axes) == top
    shape = " ".join(f"dim: {d}" for d in dims)
    net = build(
        f'layer {{ name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param {{ shape {{ {shape} }} '
        f"axis: {axis} num_axes: {num_axes} }} }}",
        x=bottom,
    )
    x = torch.randn(bottom)
    torch.testing.assert_close(net(x), x.reshape(top))


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ((-1, -1), "one -1"),
        ((5, -1), "cannot infer"),
        ((7,), "has 7 elements"),
        ((0, 0, 0, 0), "has no axis 3"),
    ],
)
def test_reshape_errors(dims, message):
    with pytest.raises(ConfigError, match=message):
        reshaped(dims, (2, 3, 4), 0, -1)


def test_argmax(build):
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0], [0.0, 5.0, 4.0, 5.0]])
    net = build(
        'layer { name: "a" type: "ArgMax" bottom: "x" top: "y" argmax_param { top_k: 2 out_max_val: true } }',
        x=(2, 4),
    )
    # Caffe sorts (value, index) pairs descending: among equal values the larger index comes first.
    assert net(x).tolist() == [[[2.0, 0.0], [3.0, 3.0]], [[3.0, 1.0], [5.0, 5.0]]]
    per_axis = build(
        'layer { name: "a" type: "ArgMax" bottom: "x" top: "y" argmax_param { axis: 0 } }', x=(2, 4)
    )
    assert per_axis(x).tolist() == [[0.0, 1.0, 1.0, 1.0]]


@pytest.mark.parametrize(("axis", "tiles", "shape"), [(1, 3, (2, 2, 3)), (0, 2, (2, 3)), (-1, 2, (2, 3, 2))])
def test_tile_matches_numpy_tile(build, axis, tiles, shape):
    import numpy as np

    net = build(
        f'layer {{ name: "t" type: "Tile" bottom: "x" top: "y" tile_param {{ axis: {axis} tiles: {tiles} }} }}',
        x=shape,
    )
    x = torch.randn(shape)
    reps = [1] * len(shape)
    reps[axis] = tiles
    expected = torch.from_numpy(np.tile(x.numpy(), reps))
    assert net.blob_shapes["y"] == tuple(expected.shape)
    torch.testing.assert_close(net(x), expected)
    with pytest.raises(ConfigError, match="tiles is required"):
        build('layer { name: "t" type: "Tile" bottom: "x" top: "y" }', x=shape)
