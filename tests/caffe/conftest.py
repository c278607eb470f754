"""Fixtures for the Caffe importer tests: build one-layer nets from inline prototxt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sparkdp.caffe.net import CaffeNet, load_net

EXAMPLES = Path(__file__).parent / "data"  # BVLC/caffe example nets, copied unchanged (see data/README.md)


def _input_layer(shapes: dict[str, tuple[int, ...]]) -> str:
    tops = " ".join(f'top: "{name}"' for name in shapes)
    dims = " ".join("shape { " + " ".join(f"dim: {d}" for d in s) + " }" for s in shapes.values())
    return f'layer {{ name: "input" type: "Input" {tops} input_param {{ {dims} }} }}\n'


@pytest.fixture
def build():
    """``build(layer_text, phase="TEST", **input_shapes) -> CaffeNet`` with an Input layer first."""

    def make(layer_text: str, phase: str = "TEST", **shapes: tuple[int, ...]) -> CaffeNet:
        torch.manual_seed(0)
        return load_net(_input_layer(shapes) + layer_text, phase=phase)

    return make


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
