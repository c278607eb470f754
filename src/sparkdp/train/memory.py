"""What a worker holds in memory: its process's peak resident set and its model state.

The model state is the bytes of the parameters, gradients and optimizer state this rank
keeps: for a sharded parameter (a DTensor) only the local shard counts. It is measured a
few times per job (after the first optimizer step, when the optimizer state first exists,
and at epoch ends), never per step: walking the optimizer state costs a pass over its dict.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

import torch
from torch import nn

from ..comm.base import Collective


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


class MemoryMeter:
    """The peak model-state bytes seen at the points the loop samples, and the process's peak RSS."""

    def __init__(self) -> None:
        self.model_state_peak = 0

    def sample(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model_state_peak = max(self.model_state_peak, model_state_bytes(model, optimizer))

    def gather(self, collective: Collective) -> list[dict[str, int]]:
        """Every rank's figures, by rank (one SUM all-reduce; an independent worker: its own)."""
        mine = [float(peak_rss_bytes()), float(self.model_state_peak)]
        if collective.independent:
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
