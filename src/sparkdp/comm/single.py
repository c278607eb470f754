"""The world-size-1 collective: every operation is the identity (design rule 5, docs/architecture.md)."""

from __future__ import annotations

import torch

from .base import Collective


class SingleProcessCollective(Collective):
    """Lets one process run exactly the code path of a distributed job."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        return None
