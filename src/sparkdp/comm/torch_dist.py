"""torch.distributed behind the Collective interface: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import ConfigError, RendezvousTimeout
from .base import Collective

log = logging.getLogger(__name__)

# gloo's worker threads drop a finished collective's tensors after ``wait()`` has
# returned, and in this torch (2.13) dropping a tensor that Python created takes
# the GIL. The process group's destructor joins those threads while holding the
# GIL, so a thread still queued for the GIL deadlocks the process: seen once as a
# rank-0 Spark task hung in ~ProcessGroupGloo (via DDP's Reducer) after training.
# Sleeping releases the GIL long enough for the threads to finish and go idle.
_QUIESCE_S = 0.05

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def set_torch_distributed_env(master_addr: str, master_port: int, rank: int, world_size: int) -> None:
    """The one place that sets the environment torch.distributed reads (design rule 6, docs/architecture.md)."""
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = "0"
    if master_addr.startswith("127.") or master_addr == "localhost":
        # gloo picks its interface from the hostname, which may not resolve to loopback.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


class TorchCollective(Collective):
    """A process group created by :meth:`setup` and destroyed by :meth:`teardown`.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks NCCL when ``device`` is CUDA.
        device: where collective buffers live (the task's GPU, or CPU).
    """

    def __init__(self, backend: str | None = None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"Unknown torch.distributed backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPU).")
        self._owns_group = False
        self._store: dist.Store | None = None

    def setup(self, *, master_addr: str, master_port: int, rank: int, world_size: int,
              timeout_s: float = 300.0, store: dist.Store | None = None) -> TorchCollective:
        """Join the process group; ``store`` is rank 0's already-listening TCPStore, if any."""
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group is already initialised in this process")
        set_torch_distributed_env(master_addr, master_port, rank, world_size)
        try:
            if store is None:
                store = dist.TCPStore(master_addr, master_port, world_size, is_master=(rank == 0),
                                      timeout=timedelta(seconds=timeout_s))
            # under NCCL the loop's small CPU tensors (loss sums, batch counts) go through gloo
            backend = "cpu:gloo,cuda:nccl" if self.backend == "nccl" else self.backend
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, TimeoutError) as exc:  # torch raises DistStoreError (RuntimeError) on timeout
            raise RendezvousTimeout(
                f"rank {rank}/{world_size} could not form the {self.backend} process group at "
                f"{master_addr}:{master_port} within {timeout_s:.0f} s: {exc}. "
                "Check that the executors can reach each other on that address."
            ) from exc
        self._owns_group = True
        self._store = store
        return self

    def stalled_ranks(self, grace_s: float = 3.0) -> list[int] | None:
        """Every rank that times out leaves a mark in rank 0's store; after ``grace_s`` (the others
        time out at about the same moment) the ranks without one are the stalled ones. A stopped
        rank 0 stops its store too: then nobody answers within the store timeout."""
        if self._store is None:
            return None
        try:
            self._store.set_timeout(timedelta(seconds=grace_s))
            self._store.set(f"sparkdp/timed-out/{self.rank}", "1")
            time.sleep(grace_s)
            missing = [r for r in range(self.world_size) if not self._store.check([f"sparkdp/timed-out/{r}"])]
        except (RuntimeError, ValueError):  # DistStoreError is a RuntimeError: the store is gone
            return [0] if self.rank != 0 else None
        return missing or None

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op == "mean":
            dist.all_reduce(tensor, dist.ReduceOp.SUM)
            tensor.div_(self.world_size)
            return tensor
        if op not in _OPS:
            raise ConfigError(f"unknown reduction {op!r}; use one of sum, mean, min, max")
        dist.all_reduce(tensor, _OPS[op])
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(tensor, src)
        return tensor

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            time.sleep(_QUIESCE_S)  # see _QUIESCE_S
            dist.destroy_process_group()
        self._owns_group = False
