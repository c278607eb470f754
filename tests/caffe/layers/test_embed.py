"""caffe/layers/embed.py: Embed against one-hot rows times the weight matrix; Parameter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparkdp.errors import ConfigError, DataError

from .blobs import set_blobs


def test_embed_is_one_hot_times_weight(build):
    net = build(
        'layer { name: "e" type: "Embed" bottom: "x" top: "y" embed_param { num_output: 4 input_dim: 5 } }',
        x=(2, 3),
    )
    w, b = torch.randn(5, 4), torch.randn(4)
    set_blobs(net, "e", w, b)
    assert [tuple(t.shape) for t in net.blobs_of("e")] == [(5, 4), (4,)]
    x = torch.tensor([[0.0, 4.0, 2.9], [1.0, 1.0, 3.0]])  # 2.9 truncates to 2, like static_cast<int>
    expected = F.one_hot(x.long(), 5).float() @ w + b
    assert net.blob_shapes["y"] == (2, 3, 4)
    torch.testing.assert_close(net(x), expected)


def test_embed_without_bias_and_errors(build):
    net = build(
        'layer { name: "e" type: "Embed" bottom: "x" top: "y" '
        "embed_param { num_output: 2 input_dim: 3 bias_term: false weight_filler { type: 'constant' value: 1 } } }",
        x=(2,),
    )
    assert len(net.blobs_of("e")) == 1
    torch.testing.assert_close(net(torch.tensor([0.0, 2.0])), torch.ones(2, 2))
    with pytest.raises(DataError, match=r"indices must lie in \[0, 3\) \(input_dim\); got \[3\]"):
        net(torch.tensor([3.0, 0.0]))
    with pytest.raises(ConfigError, match="input_dim is required"):
        build('layer { name: "e" type: "Embed" bottom: "x" top: "y" embed_param { num_output: 2 } }', x=(2,))


def test_parameter_is_a_learned_zero_blob(build):
    net = build(
        'layer { name: "p" type: "Parameter" top: "w" parameter_param { shape { dim: 2 dim: 3 } } }'
        'layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "w" top: "y" }',
        x=(2, 3),
    )
    x = torch.randn(2, 3)
    torch.testing.assert_close(net(x), x)  # Caffe's fresh blobs are zeros
    set_blobs(net, "p", torch.ones(2, 3))
    torch.testing.assert_close(net(x), x + 1)
    assert any(p.shape == (2, 3) and lr != 0 for _, p, lr, _ in net.learnable_params())
    with pytest.raises(ConfigError, match="needs parameter_param"):
        build('layer { name: "p" type: "Parameter" top: "w" }', x=(1,))
