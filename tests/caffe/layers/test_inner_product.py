"""caffe/layers/inner_product.py: InnerProduct against a plain matrix product."""

from __future__ import annotations

import torch

from .blobs import set_blobs


def test_inner_product_axis_and_transpose(build):
    net = build(
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param { num_output: 3 } }',
        x=(2, 2, 3, 4),
    )
    w, b = torch.randn(3, 24), torch.randn(3)
    set_blobs(net, "ip", w, b)
    x = torch.randn(2, 2, 3, 4)
    torch.testing.assert_close(net(x), x.reshape(2, 24) @ w.T + b)  # row-major C,H,W flattening
    net = build(
        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
        "inner_product_param { num_output: 3 axis: 2 transpose: true bias_term: false } }",
        x=(2, 2, 3, 4),
    )
    (wt,) = net.blobs_of("ip")
    assert wt.shape == (12, 3)
    set_blobs(net, "ip", torch.randn(12, 3))
    assert net.blob_shapes["y"] == (2, 2, 3)
    torch.testing.assert_close(net(x), x.reshape(2, 2, 12) @ wt)
