"""Caffe compatibility: read ``.prototxt`` nets and run them as PyTorch modules.

Parsing (:mod:`.textformat`, :mod:`.spec`) needs no torch; building (:func:`load_net`)
and :func:`inspect_net` import torch when first used.

Example:
    >>> import torch
    >>> from sparkdp.caffe import load_net
    >>> net = load_net('input: "data" input_shape { dim: 1 dim: 3 } '
    ...                'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
    ...                'inner_product_param { num_output: 2 } }', phase="TEST")
    >>> net(data=torch.ones(1, 3)).shape
    torch.Size([1, 2])

Weights: :func:`load_weights` / :func:`save_weights` read and write ``.caffemodel`` files;
:func:`convert_to_safetensors` / :func:`convert_to_caffemodel` (:mod:`.convert`, the
``sparkdp caffe convert`` command, with an example) turn them into a plain PyTorch state
dict and back.

Training a net with its solver on Spark: :func:`fit_caffe` (:mod:`.train`).
"""

from __future__ import annotations

import importlib
from typing import Any

from .spec import LayerSpec, NetSpec, NetState, ParamSpec, filter_layers, load_net_spec
from .textformat import Identifier, Message, TextFormatError, parse, parse_file

__all__ = [
    "CaffeClassifier",
    "CaffeLoss",
    "CaffeNet",
    "CaffeOptimizerFactory",
    "Identifier",
    "LayerSpec",
    "Message",
    "NetSpec",
    "NetState",
    "ParamSpec",
    "TextFormatError",
    "convert_to_caffemodel",
    "convert_to_safetensors",
    "filter_layers",
    "fit_caffe",
    "inspect_net",
    "load_net",
    "load_net_spec",
    "load_weights",
    "parse",
    "parse_file",
    "save_weights",
]

_LAZY = {
    "CaffeNet": "net",
    "load_net": "net",
    "inspect_net": "inspect",
    "CaffeClassifier": "classifier",
    "CaffeLoss": "classifier",
    "CaffeOptimizerFactory": "solver",
    "fit_caffe": "train",
    "load_weights": "weights",
    "save_weights": "weights",
    "convert_to_safetensors": "convert",
    "convert_to_caffemodel": "convert",
}


def __getattr__(name: str) -> Any:
    # Keep ``import sparkdp.caffe.textformat`` free of torch: the builders load on first use.
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
