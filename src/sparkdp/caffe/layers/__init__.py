"""Caffe layer converters, one module per layer family, registered in :data:`CONVERTERS`.

Importing this package registers every converter.  Add a layer type by writing a
function ``fn(layer, bottom_shapes, ctx) -> Built`` decorated with ``@converter("Type")``.
"""

from __future__ import annotations

from . import (  # noqa: F401
    activation,
    combine,
    conv,
    data,
    embed,
    inner_product,
    losses,
    margin,
    normalization,
    pooling,
    recurrent,
    reduction,
    select,
    shape,
)
from .base import CONVERTERS, SUPPORTED, BuildContext, Built, CaffeLayer, Shape, converter
from .fillers import fill_

__all__ = ["CONVERTERS", "SUPPORTED", "BuildContext", "Built", "CaffeLayer", "Shape", "converter", "fill_"]
