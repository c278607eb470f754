"""caffe/layers/select.py: BatchReindex and Filter against tensor indexing."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError, DataError


def test_batch_reindex_gathers_rows(build):
    net = build('layer { name: "r" type: "BatchReindex" bottom: "x" bottom: "i" top: "y" }', x=(3, 2), i=(4,))
    x, index = torch.arange(6.0).reshape(3, 2), torch.tensor([2.0, 0.0, 2.0, 1.0])
    assert net.blob_shapes["y"] == (4, 2)
    torch.testing.assert_close(net(x, index), x[[2, 0, 2, 1]])
    with pytest.raises(DataError, match=r"indices must lie in \[0, 3\)"):
        net(x, torch.tensor([0.0, 3.0, 0.0, 0.0]))


def test_filter_keeps_selected_rows_of_every_bottom(build):
    net = build(
        'layer { name: "f" type: "Filter" bottom: "a" bottom: "b" bottom: "s" top: "fa" top: "fb" }',
        a=(4, 2),
        b=(4,),
        s=(4, 1),
    )
    a, b = torch.randn(4, 2), torch.arange(4.0)
    out = net(a, b, torch.tensor([[1.0], [0.0], [0.5], [0.0]]))
    torch.testing.assert_close(out["fa"], a[[0, 2]])
    torch.testing.assert_close(out["fb"], b[[0, 2]])
    with pytest.raises(ConfigError, match=r"one top per filtered bottom \(2\)"):
        build(
            'layer { name: "f" type: "Filter" bottom: "a" bottom: "b" bottom: "s" top: "fa" }',
            a=(4, 2),
            b=(4,),
            s=(4,),
        )
    with pytest.raises(ConfigError, match="bottom 'a' has 3 rows but the selector has 4"):
        build('layer { name: "f" type: "Filter" bottom: "a" bottom: "s" top: "fa" }', a=(3, 2), s=(4,))
