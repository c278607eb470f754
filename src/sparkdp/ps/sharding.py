"""Split a model's parameters into K shards balanced by bytes.

Why shards at all: each shard has its own lock and version counter, so while one
worker's push is being applied to shard 1, another worker's push can already run on
shard 0 — the server pipelines concurrent pushes instead of serialising them on one
lock (Downpour, Dean et al. 2012; ps-lite key ranges).

How the split works: lay the parameters end to end as one virtual flat byte array
(in the order given) and cut it at ``s * total_bytes / K``.  A tensor of at least
``min_split_bytes`` that straddles a cut is split there into contiguous flat chunks
(``t.view(-1)[start:stop]``), so one huge FC weight is spread over every shard instead
of landing on one (the imbalance docs/algorithms.md §8 describes for MXNet, which hashes
small arrays to one server and splits only arrays above 1e6 elements).  Smaller
tensors are never split; each goes whole to the shard that holds its middle byte, so
shard sizes differ by at most ``min_split_bytes``.  Each shard therefore sees a list of
1-D pieces; update rules are elementwise, so they do not care.

Example:
    >>> import torch
    >>> plan = ShardPlan.build([torch.zeros(1000, 1000), torch.zeros(10)], num_shards=2)
    >>> [sum(p.stop - p.start for p in s) for s in plan.shards]
    [500005, 500005]
"""

from __future__ import annotations

import bisect
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sparkdp.errors import ConfigError

#: One shard per this many bytes of parameters (below it, lock contention is not the
#: bottleneck and a shard's fixed cost — a lock, a version, a rule instance — dominates).
BYTES_PER_SHARD = 8 * 2**20
#: More shards than this stops helping: concurrent pushes are bounded by cores.
MAX_DEFAULT_SHARDS = 8
#: Tensors smaller than this are never split.
MIN_SPLIT_BYTES = 64 * 2**10


class Piece(NamedTuple):
    """Elements ``[start, stop)`` of the flattened parameter ``param``."""

    param: int
    start: int
    stop: int


@dataclass(frozen=True)
class ParamSpec:
    """Dtype and shape of one parameter (what the wire and the checkpoint check)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def default_num_shards(total_bytes: int) -> int:
    """~1 shard per 8 MiB, at least 1, at most ``min(8, cpu count)``."""
    cap = max(1, min(MAX_DEFAULT_SHARDS, os.cpu_count() or 1))
    return max(1, min(cap, math.ceil(total_bytes / BYTES_PER_SHARD)))


@dataclass(frozen=True)
class ShardPlan:
    """Which flat element ranges of which parameter belong to which shard."""

    params: tuple[ParamSpec, ...]
    shards: tuple[tuple[Piece, ...], ...]

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @classmethod
    def build(
        cls,
        params: Sequence[Tensor],
        num_shards: int | None = None,
        *,
        min_split_bytes: int = MIN_SPLIT_BYTES,
    ) -> ShardPlan:
        """Plan shards for ``params``; ``num_shards=None`` picks :func:`default_num_shards`.

        Fewer shards than requested come back when there is not enough to fill them
        (e.g. 4 shards of a 3-element model): an empty shard would only add a lock.
        """
        specs = tuple(ParamSpec(p.dtype, tuple(p.shape)) for p in params)
        if not specs:
            raise ConfigError("ShardPlan.build got no parameters; pass at least one tensor.")
        total = sum(s.nbytes for s in specs)
        k = default_num_shards(total) if num_shards is None else int(num_shards)
        if k < 1:
            raise ConfigError(f"num_shards must be >= 1 or None (automatic), got {num_shards!r}.")
        bounds = [s * total / k for s in range(k + 1)]  # byte cuts of the virtual flat array
        shards: list[list[Piece]] = [[] for _ in range(k)]
        offset = 0
        for index, spec in enumerate(specs):
            size, item = spec.nbytes, spec.dtype.itemsize
            if size == 0:
                continue  # nothing to update; pull still returns an empty tensor of this shape
            if size < min_split_bytes:
                shards[_shard_of(offset + size / 2, bounds)].append(Piece(index, 0, spec.numel))
            else:
                start = 0
                while start < spec.numel:
                    s = _shard_of(offset + start * item, bounds)
                    cut = spec.numel if s == k - 1 else math.ceil((bounds[s + 1] - offset) / item)
                    stop = max(start + 1, min(spec.numel, cut))
                    shards[s].append(Piece(index, start, stop))
                    start = stop
            offset += size
        return cls(specs, tuple(tuple(s) for s in shards if s))

    def shard_bytes(self) -> list[int]:
        return [sum((p.stop - p.start) * self.params[p.param].dtype.itemsize for p in s) for s in self.shards]

    def check(self, tensors: Sequence[Tensor], what: str = "tensors") -> None:
        """Raise ValueError naming the first tensor whose count, dtype or shape is off."""
        if len(tensors) != len(self.params):
            raise ValueError(
                f"{what}: got {len(tensors)} tensors, the server holds {len(self.params)} parameters."
            )
        for i, (t, spec) in enumerate(zip(tensors, self.params, strict=True)):
            if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                raise ValueError(
                    f"{what}[{i}]: got dtype={t.dtype} shape={tuple(t.shape)}, "
                    f"expected dtype={spec.dtype} shape={spec.shape} (same order as the server's parameters)."
                )

    def views(self, tensors: Sequence[Tensor], shard: int) -> list[Tensor]:
        """1-D views (no copies) of shard ``shard``'s pieces of contiguous ``tensors``."""
        return [tensors[p.param].view(-1)[p.start : p.stop] for p in self.shards[shard]]

    def to_json(self) -> dict[str, Any]:
        return {
            "params": [[str(s.dtype).removeprefix("torch."), list(s.shape)] for s in self.params],
            "shards": [[list(p) for p in s] for s in self.shards],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardPlan:
        from sparkdp.ps.codec import dtype_from_name  # codec owns the dtype whitelist

        specs = tuple(
            ParamSpec(dtype_from_name(d), tuple(int(x) for x in shape)) for d, shape in data["params"]
        )
        shards = tuple(tuple(Piece(*map(int, p)) for p in s) for s in data["shards"])
        return cls(specs, shards)


def _shard_of(byte_position: float, bounds: list[float]) -> int:
    """Index s with bounds[s] <= position < bounds[s+1] (clamped to the first and last shard)."""
    return max(bisect.bisect_right(bounds, byte_position, 0, len(bounds) - 1) - 1, 0)
