"""The collective-communication interface the synchronous strategies use (cf. Fabric's Collective)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class Collective(ABC):
    """Rank, world size and the few collectives sparkdp needs.

    ``all_reduce`` works in place. ``op`` is ``"sum"``, ``"mean"``, ``"min"`` or ``"max"``.
    """

    device: torch.device = torch.device("cpu")

    @property
    @abstractmethod
    def rank(self) -> int: ...

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor: ...

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor: ...

    @abstractmethod
    def barrier(self) -> None: ...

    def all_reduce_coalesced(self, tensors: Sequence[torch.Tensor], op: str = "sum") -> None:
        """All-reduce many tensors in place through one flat buffer per dtype
        (one message instead of one per tensor)."""
        for group in _by_dtype(tensors).values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            self.all_reduce(flat, op)
            _unflatten_into(flat, group)

    def broadcast_coalesced(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Broadcast many tensors in place from ``src`` through one flat buffer per dtype."""
        for group in _by_dtype(tensors).values():
            flat = torch.cat([t.detach().reshape(-1) for t in group])
            self.broadcast(flat, src)
            _unflatten_into(flat, group)

    def stalled_ranks(self, grace_s: float = 3.0) -> list[int] | None:
        """After a collective timed out here: the ranks that did not time out too (so are not
        waiting: stopped, hung). None when that cannot be told. Default: cannot."""
        return None

    def teardown(self) -> None:
        """Release what setup acquired. Default: nothing."""


def _by_dtype(tensors: Sequence[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        with torch.no_grad():
            t.copy_(flat[offset:offset + n].view_as(t))
        offset += n
