"""Collectives that never communicate (design rule 5, docs/architecture.md).

``SingleProcessCollective`` lets one process run exactly the code path of a distributed
job; ``IndependentCollective`` is one of N asynchronous workers, which share nothing but
the parameter server: its rank and world size shard the data, and every collective is the
identity.
"""

from __future__ import annotations

import torch

from .base import Collective


class IndependentCollective(Collective):
    """Worker ``rank`` of ``world_size`` workers that do not talk to each other."""

    independent = True

    def __init__(self, rank: int = 0, world_size: int = 1, device: torch.device | None = None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}); got {rank}.")
        self._rank, self._world_size = rank, world_size
        if device is not None:
            self.device = device

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        return None


class SingleProcessCollective(IndependentCollective):
    """World size 1: a group of one process."""

    independent = False

    def __init__(self) -> None:
        super().__init__(0, 1)
