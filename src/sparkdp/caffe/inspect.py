"""Summarise a Caffe net: output shapes from a real forward pass, parameter counts, layers.

Used by ``sparkdp caffe inspect`` and handy in notebooks to check that a prototxt
converts to the shapes Caffe would report.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from .layers.data import SOURCE_TYPES
from .net import load_net
from .spec import NetState, filter_layers, load_net_spec


def inspect_net(
    prototxt: str | os.PathLike[str],
    phase: str = "TEST",
    input_shape: Sequence[int] | None = None,
    stages: Sequence[str] = (),
) -> dict[str, Any]:
    """Build the net for ``phase`` and run it once on zeros.

    Args:
        prototxt: path or text of the net.
        phase: ``"TRAIN"`` or ``"TEST"``.
        input_shape: full shape of the first fed blob (e.g. ``data``); required for
            ``Data`` layers, optional for ``Input`` (overrides).  Labels follow its batch size.
        stages: NetState stages for include/exclude rules.

    Returns:
        ``{"name", "phase", "inputs", "outputs", "learnable_params", "frozen_params", "layers"}``;
        ``outputs`` maps each output blob to its shape from the forward pass, ``layers`` holds
        one row per layer (name, type, bottoms, tops, top_shapes, params).
    """
    phase = str(phase).upper()
    spec = load_net_spec(prototxt)
    shapes = {}
    if input_shape is not None:
        kept = filter_layers(spec, NetState(phase, 0, tuple(stages))).layers
        first = next((layer.tops[0] for layer in kept if layer.type in SOURCE_TYPES and layer.tops), None)
        if first is not None:
            shapes[first] = tuple(int(d) for d in input_shape)
    net = load_net(spec, phase=phase, stages=stages, input_shapes=shapes)
    net.eval()  # no dropout, no BatchNorm statistics updates while probing shapes
    with torch.no_grad():
        out = net(**{name: torch.zeros(shape) for name, shape in net.input_shapes.items()})
    outputs = out if isinstance(out, dict) else {net.output_names[0]: out}
    params = net.learnable_params()
    return {
        "name": net.name,
        "phase": phase,
        "inputs": {name: list(shape) for name, shape in net.input_shapes.items()},
        "outputs": {name: list(t.shape) for name, t in outputs.items()},
        "learnable_params": sum(p.numel() for _, p, lr, _ in params if lr != 0),
        "frozen_params": sum(p.numel() for _, p, lr, _ in params if lr == 0),
        "layers": net.layer_rows(),
    }
