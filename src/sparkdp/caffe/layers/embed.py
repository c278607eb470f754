"""Layers whose output is a learned table: Embed (a lookup) and Parameter (a bare blob).

Embed (``embed_layer.cpp``) reads integer indices stored as floats (truncated like
``static_cast<int>``), weight blob ``[input_dim, num_output]`` (the transpose of
InnerProduct's), top ``bottom.shape + [num_output]``.  It equals InnerProduct on one-hot
rows.  Parameter (``parameter_layer.cpp``) has no bottom; its one blob, zero-initialised
as Caffe's fresh blobs are, is its top — a way to learn a tensor shared by other layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..spec import LayerSpec
from .base import (
    BuildContext,
    Built,
    CaffeLayer,
    Shape,
    check_range,
    converter,
    fail,
    flag,
    integer,
    shape_of,
)
from .fillers import fill_blobs


class Embed(CaffeLayer):
    bias: nn.Parameter | None  # registered with register_parameter (None without bias_term)

    def __init__(self, input_dim: int, n: int, bias: bool, who: str) -> None:
        super().__init__()
        self.add_weight_bias((input_dim, n), n if bias else None)
        self.who = who

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        index = x.to(torch.int64)
        check_range(index, self.weight.shape[0], self.who, "indices", " (input_dim)")
        out = F.embedding(index, self.weight)
        return (out + self.bias if self.bias is not None else out,)


@converter("Embed", bottoms=1, tops=1)
def embed(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("embed_param")
    n, input_dim = integer(layer, p, "num_output"), integer(layer, p, "input_dim")
    if n <= 0 or input_dim <= 0:
        raise fail(layer, f"num_output and input_dim must be positive; got {n} and {input_dim}")
    bias = flag(layer, p, "bias_term", True)
    module = Embed(input_dim, n, bias, layer.describe())
    fill_blobs(layer, module, p)
    return Built(module, [(*shapes[0], n)])


class Parameter(CaffeLayer):
    blob_names = ("blob",)

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.blob = nn.Parameter(torch.zeros(shape))

    def forward(self) -> tuple[torch.Tensor]:
        return (self.blob,)


@converter("Parameter", bottoms=0, tops=1)
def parameter(layer: LayerSpec, shapes: list[Shape], ctx: BuildContext) -> Built:
    p = layer.sub("parameter_param")
    if not p.has("shape"):
        raise fail(layer, "needs parameter_param { shape { dim: ... } }")
    shape = shape_of(layer, p.get("shape"))
    return Built(Parameter(shape), [shape])
