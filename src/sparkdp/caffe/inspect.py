"""Summarise a Caffe net: output shapes from a real forward pass, parameter counts, layers.

Used by ``sparkdp caffe inspect`` and handy in notebooks to check that a prototxt
converts to the shapes Caffe would report.

Example (BVLC's ``hdf5_classification``: every HDF5Data top needs a shape):
    >>> net = (
    ...     'layer { name: "data" type: "HDF5Data" top: "data" top: "label" '
    ...     '  hdf5_data_param { source: "train.txt" batch_size: 10 } } '
    ...     'layer { name: "fc1" type: "InnerProduct" bottom: "data" top: "fc1" '
    ...     '  inner_product_param { num_output: 2 } } '
    ...     'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc1" bottom: "label" top: "loss" }')
    >>> report = inspect_net(net, phase="TRAIN", input_shapes={"data": (10, 4), "label": (10,)})
    >>> report["outputs"], report["learnable_params"]
    ({'loss': []}, 10)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from .layers.data import SOURCE_TYPES
from .net import load_net
from .spec import NetSpec, NetState, filter_layers, load_net_spec
from .textformat import Message

__all__ = ["input_names", "inspect_net", "resolve_input_shapes"]


def input_names(spec: NetSpec, phase: str = "TEST", stages: Sequence[str] = (), level: int = 0) -> list[str]:
    """Tops of the data/source layers (``Input``, ``Data``, ``HDF5Data``…) of the built phase, in order."""
    kept = filter_layers(spec, NetState(str(phase).upper(), int(level), tuple(stages))).layers
    names = [top for layer in kept if layer.type in SOURCE_TYPES for top in layer.tops]
    return list(dict.fromkeys(names))


def resolve_input_shapes(
    spec: NetSpec,
    phase: str = "TEST",
    stages: Sequence[str] = (),
    input_shape: Sequence[int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    level: int = 0,
) -> dict[str, tuple[int, ...]]:
    """Merge the first input's shape and shapes by name into ``{input name: shape}``.

    ``input_shape`` (no name) is the first input's; ``input_shapes`` names inputs, which must
    be tops of the phase's data/source layers.  Giving the first input both ways is an error.

    Raises:
        ConfigError: a name is not an input of the net, an input is given twice, or
            ``input_shape`` is given for a net without inputs.
    """
    phase = str(phase).upper()
    names = input_names(spec, phase, stages, level)
    listing = ", ".join(names) or "none"
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in (input_shapes or {}).items():
        if name not in names:
            raise ConfigError(
                f"input shape given for {name!r}, which is not an input of the {phase} net; "
                f"its inputs (tops of its data layers) are: {listing}"
            )
        shapes[name] = tuple(int(d) for d in shape)
    if input_shape is not None:
        if not names:
            raise ConfigError(f"an input shape was given, but the {phase} net has no data/input layers")
        first = names[0]
        if first in shapes:
            raise ConfigError(
                f"the shape of the first input {first!r} is given twice (without a name and as "
                f"{first}=...); give it once"
            )
        shapes[first] = tuple(int(d) for d in input_shape)
    return shapes


def inspect_net(
    prototxt: str | os.PathLike[str] | Message | NetSpec,
    phase: str = "TEST",
    input_shape: Sequence[int] | None = None,
    stages: Sequence[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Build the net for ``phase`` and run it once on zeros.

    Args:
        prototxt: path or text of the net.
        phase: ``"TRAIN"`` or ``"TEST"``.
        input_shape: full shape of the first fed blob (e.g. ``data``); required for
            ``Data`` layers, optional for ``Input`` (overrides).  Labels follow its batch size.
        stages: NetState stages for include/exclude rules.
        input_shapes: full shapes by input name, e.g. ``{"data": (10, 4), "label": (10,)}``
            for an ``HDF5Data`` layer, whose every top needs one; each name must be a top of
            one of the phase's data/source layers.

    Returns:
        ``{"name", "phase", "inputs", "outputs", "learnable_params", "frozen_params", "layers"}``;
        ``outputs`` maps each output blob to its shape from the forward pass, ``layers`` holds
        one row per layer (name, type, bottoms, tops, top_shapes, params).

    Raises:
        ConfigError: the net does not build, or a shape names no input of the net.
    """
    phase = str(phase).upper()
    spec = load_net_spec(prototxt)
    shapes = resolve_input_shapes(spec, phase, stages, input_shape, input_shapes)
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
