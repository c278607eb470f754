"""Row selection: BatchReindex (gather rows by index) and Filter (keep rows whose selector is nonzero).

Both change the batch size; Filter's depends on the data, so the shape computed while
building is an upper bound (the bottom's) and the real one appears in the forward pass.
"""

from __future__ import annotations

import torch

from ..spec import LayerSpec
from .base import BuildContext, Built, CaffeLayer, Shape, check_range, converter, count, fail


class BatchReindex(CaffeLayer):
    config = ("who",)
    who: str

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor]:
        rows = index.reshape(-1).to(torch.int64)
        check_range(rows, x.shape[0], self.who, "indices", " (the batch size)")
        return (x.index_select(0, rows),)


@converter("BatchReindex", bottoms=2, tops=1)
def batch_reindex(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    if len(shapes[1]) != 1:
        raise fail(layer, f"the index bottom must be 1-D; got shape {list(shapes[1])}")
    return Built(BatchReindex(layer.describe()), [(shapes[1][0], *shapes[0][1:])])


class Filter(CaffeLayer):
    def forward(self, *bottoms: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = (bottoms[-1].reshape(-1) != 0).nonzero()[:, 0]
        return tuple(b.index_select(0, keep) for b in bottoms[:-1])


@converter("Filter", bottoms=(2, 99))
def filter_layer(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    if len(layer.tops) != len(shapes) - 1:
        raise fail(layer, f"needs one top per filtered bottom ({len(shapes) - 1}); got {len(layer.tops)}")
    selector = shapes[-1]
    if count(selector) != selector[0]:
        raise fail(layer, f"the selector (last bottom) needs shape (N,) or (N, 1); got {list(selector)}")
    for name, shape in zip(layer.bottoms, shapes[:-1]):
        if shape[0] != selector[0]:
            raise fail(layer, f"bottom {name!r} has {shape[0]} rows but the selector has {selector[0]}")
    return Built(Filter(), list(shapes[:-1]))
