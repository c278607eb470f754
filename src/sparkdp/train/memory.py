"""What a worker holds in memory: its process's peak resident set and its model state.

The model state is the bytes of the parameters, gradients and optimizer state this rank
keeps: for a sharded parameter (a DTensor) only the local shard counts. It is measured a
few times per job (after the first optimizer step, when the optimizer state first exists,
and at epoch ends), never per step: walking the optimizer state costs a pass over its dict.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..comm.base import Collective
from .role import role_of


def local_bytes(tensor: Any) -> int:
    """Bytes of ``tensor`` held by this rank (a DTensor's local shard; 0 for a non-tensor)."""
    if not isinstance(tensor, torch.Tensor):
        return 0
    to_local = getattr(tensor, "to_local", None)
    local = to_local() if callable(to_local) else tensor
    return local.numel() * local.element_size()


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters + gradients + optimizer state held by this rank, in bytes."""
    total = 0
    for p in model.parameters():
        total += local_bytes(p) + local_bytes(p.grad)
    for state in optimizer.state.values():
        total += sum(local_bytes(v) for v in state.values())
    return total


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


#: what torch's CPU allocator and CUDA say when an allocation fails (a RuntimeError, not a MemoryError)
_ALLOCATION_FAILED = (
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA out of memory",
    "Cannot allocate memory",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an allocation that failed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or (
            isinstance(current, RuntimeError) and any(text in str(current) for text in _ALLOCATION_FAILED)
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def memory_limit_bytes() -> int | None:
    """The most memory this process may use, where something limits it: its address-space
    rlimit (what ``spark.executor.pyspark.memory`` sets on a Python worker), else its cgroup's
    ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1); None when nothing does."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return int(soft)
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            limit = Path("/sys/fs/cgroup", path.lstrip("/"), "memory.max")
        elif "memory" in controllers.split(","):
            limit = Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.limit_in_bytes")
        else:
            continue
        try:
            value = limit.read_text().strip()
        except OSError:
            continue
        # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1
        if value.isdigit() and int(value) < 1 << 62:
            return int(value)
    return None


def optimizer_states(cls: type | None, options: dict[str, Any]) -> int:
    """Tensors the size of the parameters that a ``cls`` optimizer keeps (AdamW: its two
    moments); 2 for an optimizer this does not know."""
    name = cls.__name__ if cls is not None else ""
    if name == "SGD":
        return 1 if options.get("momentum") else 0
    if name == "RMSprop":
        return 1 + bool(options.get("momentum")) + bool(options.get("centered"))
    if name == "Adagrad":
        return 1
    if name in ("Adam", "AdamW"):
        return 2 + bool(options.get("amsgrad"))
    return 2


class MemoryMeter:
    """The peak model-state bytes seen at the points the loop samples, and the process's peak RSS."""

    def __init__(self) -> None:
        self.model_state_peak = 0

    def sample(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model_state_peak = max(self.model_state_peak, model_state_bytes(model, optimizer))

    def gather(self, collective: Collective) -> list[dict[str, int]]:
        """Every rank's figures, by rank (one SUM all-reduce; a worker alone, not in a group: its own)."""
        mine = [float(peak_rss_bytes()), float(self.model_state_peak)]
        if not role_of(collective).agrees_with_peers:
            return [
                {"worker": collective.rank, "peak_rss_bytes": int(mine[0]), "model_state_bytes": int(mine[1])}
            ]
        table = torch.zeros(collective.world_size, 2, dtype=torch.float64)  # exact to 2**53 bytes
        table[collective.rank] = torch.tensor(mine, dtype=torch.float64)
        collective.all_reduce(table, "sum")
        return [
            {"worker": rank, "peak_rss_bytes": int(rss), "model_state_bytes": int(state)}
            for rank, (rss, state) in enumerate(table.tolist())
        ]
