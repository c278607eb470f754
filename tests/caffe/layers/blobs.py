"""Setting a built layer's blobs (weights, biases) to chosen values in layer tests."""

from __future__ import annotations

import torch


def set_blobs(net, layer: str, *values: torch.Tensor) -> None:
    with torch.no_grad():
        for blob, value in zip(net.blobs_of(layer), values, strict=True):
            blob.copy_(value)
