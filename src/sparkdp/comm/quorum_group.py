"""One quorum's process group in a per-step fault-tolerant job: a standalone gloo group per
quorum, never torch.distributed's default group, so that a group broken by a lost worker is
simply left behind and the next quorum's group forms at once (about 0.02 s after a SIGKILL with
torch 2.13 on one machine).

Each group rendezvouses on the driver's ``TCPStore`` under its quorum's own prefix, so keys of an
earlier quorum never mix with the next one's. A group left behind is released by a thread of its
own: its destructor may wait for gloo's threads, and a training thread must not.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .base import Collective
from .torch_dist import choose_gloo_interface

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
#: how long a left-behind group is kept before it is released (see comm.torch_dist's _QUIESCE_S)
_RELEASE_AFTER_S = 1.0


def store_client(host: str, port: int, timeout_s: float) -> Any:
    """A client of the driver's rendezvous store at ``host:port``; gloo then uses the interface
    that reaches it."""
    choose_gloo_interface(host)
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), use_libuv=True)


class QuorumGroup(Collective):
    """Rank ``rank`` of ``world`` in quorum number ``quorum`` (a group of one needs no gloo)."""

    def __init__(self, store: Any, quorum: int, rank: int, world: int, timeout_s: float) -> None:
        self.quorum, self._rank, self._world = quorum, rank, world
        self._group: Any = None
        if world > 1:
            prefixed = dist.PrefixStore(f"sparkdp-quorum-{quorum}/", store)
            self._group = dist.ProcessGroupGloo(prefixed, rank, world, timedelta(seconds=timeout_s))

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self._group is None:
            return tensor
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp(_OPS["sum" if op == "mean" else op])
        self._group.allreduce([tensor], options).wait()
        if op == "mean":
            tensor.div_(self._world)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self._group is not None:
            options = dist.BroadcastOptions()
            options.rootRank = src
            self._group.broadcast([tensor], options).wait()
        return tensor

    def barrier(self) -> None:
        if self._group is not None:
            self._group.barrier().wait()

    def teardown(self) -> None:
        """Leave this group behind: a thread releases it after gloo's threads went idle."""
        group, self._group = self._group, None
        if group is not None:
            threading.Thread(
                target=_release, args=([group],), name="sparkdp-quorum-release", daemon=True
            ).start()


def _release(held: list[Any]) -> None:
    time.sleep(_RELEASE_AFTER_S)
    held.clear()


__all__ = ["QuorumGroup", "store_client"]
