"""The collective-communication interface the synchronous strategies use (cf. Fabric's Collective)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch


class Collective(ABC):
    """Rank, world size and the few collectives sparkdp needs.

    ``all_reduce`` works in place. ``op`` is ``"sum"``, ``"mean"``, ``"min"`` or ``"max"``.
    """

    device: torch.device = torch.device("cpu")
    #: the workers share no process group (an asynchronous job's tasks): each reports for itself
    independent: bool = False

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
        _coalesced(tensors, lambda flat: self.all_reduce(flat, op))

    def broadcast_coalesced(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """Broadcast many tensors in place from ``src`` through one flat buffer per dtype."""
        _coalesced(tensors, lambda flat: self.broadcast(flat, src))

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype everywhere), by rank. Default: a group of
        one (the collectives that never communicate)."""
        if self.world_size != 1:
            raise NotImplementedError(f"{type(self).__name__} cannot gather from {self.world_size} ranks")
        return [tensor.clone()]

    def start_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        """Begin an in-place all-reduce and return at once; ``wait()`` finishes it. Every rank
        must start collectives in the same order. Default: reduce now (nothing to overlap)."""
        self.all_reduce(tensor, op)
        return Pending(lambda: tensor)

    def start_all_gather(self, tensor: torch.Tensor) -> Pending:
        """Begin :meth:`all_gather`; ``wait()`` returns the tensors by rank."""
        gathered = self.all_gather(tensor)
        return Pending(lambda: gathered)

    def stalled_ranks(self, grace_s: float = 3.0) -> list[int] | None:
        """After a collective timed out here: the ranks that did not time out too (so are not
        waiting: stopped, hung). None when that cannot be told. Default: cannot."""
        return None

    def teardown(self) -> None:
        """Release what setup acquired. Default: nothing."""


class Pending:
    """A collective begun with ``start_*``: :meth:`wait` blocks until it is done and returns its
    result (the reduced tensor, or the gathered list)."""

    __slots__ = ("_finish",)

    def __init__(self, finish: Callable[[], object]) -> None:
        self._finish = finish

    def wait(self):  # noqa: ANN201 (a tensor or a list of them, by collective)
        return self._finish()


def _coalesced(tensors: Sequence[torch.Tensor], collective: Callable[[torch.Tensor], object]) -> None:
    """Run ``collective`` in place on one flat copy per dtype, then copy the results back."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    for group in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        collective(flat)
        with torch.no_grad():
            for t, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
                t.copy_(part.view_as(t))


def is_collective_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that waited out its timeout. Gloo raises a plain
    ``RuntimeError`` ("Timed out waiting ...ms for recv operation"), so its text is all there
    is; this is the one place it is read (the worker then raises a typed ``WorkerHung``)."""
    return isinstance(exc, RuntimeError) and "timed out" in str(exc).lower()
