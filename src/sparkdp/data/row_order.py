"""Row-level access to data stored in units (Parquet row groups), for per-step fault tolerance.

With ``fault_tolerance="step"`` every step trains the next global batch of the epoch's order of
rows, split between the workers present (``train.row_cursor``). In-memory data can use any
permutation; data read from files cannot: a permutation of all rows would make every worker
read every row group at every step. :class:`LaneOrder` is an order made for reading:

* the units are put in a seeded per-epoch order and laid end to end, and the rows inside each
  window of consecutive units (about ``window_rows`` rows: the data's shuffle buffer) are
  permuted, seeded by (seed, epoch, window): a bounded shuffle, as in the restart mode's reading;
* that sequence is cut into one contiguous lane per worker slot of the job, and step ``s`` takes
  the ``block`` rows at ``s * block`` of every lane, lane after lane.

So while the quorum is whole, rank ``r``'s share of each step is exactly lane ``r``'s block: a
worker reads its own lane's row groups, about ``1 / workers`` of the data an epoch, a window at a
time. When a worker leaves, the survivors' shares cover its lane too (the order does not change,
only who trains which part of a step), so each row is still trained once an epoch.

:class:`UnitRows` reads rows by id: whole units, converted once and kept in a cache bounded in
rows (evicting the least recently used): about two windows' rows, more only while one step's rows
need more (after a leave, a share that spans two lanes' windows).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import DataError
from .shuffle import seeded_generator, unit_order

#: window permutations a LaneOrder keeps (a step touches one or two windows per lane)
_KEPT_WINDOWS = 8


def unit_offsets(sizes: Sequence[int]) -> torch.Tensor:
    """Each unit's first row id when the units are laid end to end in storage order (and the total)."""
    return torch.cumsum(torch.tensor([0, *sizes], dtype=torch.int64), 0)


@dataclass
class LaneOrder:
    """Epoch ``epoch``'s order of the rows of units of ``sizes`` rows (storage order), for a job of
    ``lanes`` worker slots taking ``block`` rows of each lane a step. Sliced like a tensor of row
    ids (``order[a:b]``), computed lazily a window at a time."""

    sizes: Sequence[int]
    epoch: int
    seed: int
    shuffle: bool
    window_rows: int
    lanes: int
    block: int
    _windows: OrderedDict[int, torch.Tensor] = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        self.offsets = unit_offsets(self.sizes)
        self.rows = int(self.offsets[-1])
        units = unit_order(len(self.sizes), self.epoch, self.seed, self.shuffle)
        #: the windows: their units (in the epoch's order) and first positions in the sequence
        self.window_units: list[list[int]] = []
        starts, filled = [0], 0
        for unit in units:
            if not self.window_units or filled >= max(self.window_rows, 1):
                if self.window_units:
                    starts.append(starts[-1] + filled)
                self.window_units.append([])
                filled = 0
            self.window_units[-1].append(unit)
            filled += self.sizes[unit]
        self.window_starts = torch.tensor([*starts, self.rows], dtype=torch.int64)
        self.lane_starts = [lane * self.rows // self.lanes for lane in range(self.lanes + 1)]

    @property
    def key(self) -> str:
        """What this order depends on besides (seed, epoch): equal keys, equal orders."""
        return (
            f"lanes of {self.rows} rows in {len(self.sizes)} units: {self.lanes} x {self.block} rows a step, "
            f"windows of {self.window_rows} rows"
        )

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: slice) -> torch.Tensor:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("a LaneOrder is read in contiguous slices (order[a:b])")
        start, stop, _ = index.indices(self.rows)
        if start >= stop:
            return torch.zeros(0, dtype=torch.int64)
        per_step = self.lanes * self.block
        parts = []
        for step in range(start // per_step, (stop - 1) // per_step + 1):
            first = step * per_step
            ids = self.step_ids(step)
            parts.append(ids[max(start - first, 0) : stop - first])
        return torch.cat(parts)

    def step_ids(self, step: int) -> torch.Tensor:
        """The row ids of step ``step``: each lane's block in turn (shorter in the last step)."""
        parts = []
        for lane in range(self.lanes):
            lo, hi = self.lane_starts[lane], self.lane_starts[lane + 1]
            a, b = lo + step * self.block, min(lo + (step + 1) * self.block, hi)
            if a < b:
                parts.append(self.sequence(a, b))
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def sequence(self, lo: int, hi: int) -> torch.Tensor:
        """Row ids at positions ``[lo, hi)`` of the windowed sequence (before the lanes' interleaving)."""
        first = int(torch.searchsorted(self.window_starts, lo, right=True)) - 1
        parts = []
        for w in range(first, len(self.window_units)):
            ws, we = int(self.window_starts[w]), int(self.window_starts[w + 1])
            if ws >= hi:
                break
            ids = self.window(w)
            parts.append(ids[max(lo, ws) - ws : min(hi, we) - ws])
        return torch.cat(parts)

    def window(self, w: int) -> torch.Tensor:
        """Window ``w``'s row ids in their order (its units end to end, rows permuted when shuffling)."""
        if w in self._windows:
            self._windows.move_to_end(w)
            return self._windows[w]
        ids = torch.cat(
            [self.offsets[u] + torch.arange(self.sizes[u], dtype=torch.int64) for u in self.window_units[w]]
        )
        if self.shuffle and self.window_rows > 0:
            ids = ids[torch.randperm(len(ids), generator=seeded_generator(self.seed, self.epoch, w))]
        self._windows[w] = ids
        while len(self._windows) > _KEPT_WINDOWS:
            self._windows.popitem(last=False)
        return ids


class UnitRows:
    """Rows by id (storage order) from units of ``sizes`` rows, ``read_unit(u)`` converting a whole
    unit to column tensors; at most about ``capacity_rows`` rows are kept between calls."""

    def __init__(
        self,
        sizes: Sequence[int],
        read_unit: Callable[[int], tuple[torch.Tensor, ...]],
        capacity_rows: int,
    ) -> None:
        self.sizes, self.read_unit, self.capacity_rows = list(sizes), read_unit, capacity_rows
        self.offsets = unit_offsets(self.sizes)
        self.cache: OrderedDict[int, tuple[torch.Tensor, ...]] = OrderedDict()
        self.units_read = 0  # units read from storage, for tests and the curious

    def take(self, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The rows ``ids``, in that order, as column tensors."""
        units = torch.searchsorted(self.offsets[1:], ids, right=True)
        within = ids - self.offsets[units]
        needed = units.unique().tolist()
        loaded = {u: self.unit(u) for u in needed}
        self.evict(keep=set(needed))
        template = loaded[needed[0]] if needed else ()
        out = [torch.empty((len(ids), *t.shape[1:]), dtype=t.dtype) for t in template]
        for u, columns in loaded.items():
            mask = units == u
            for o, column in zip(out, columns, strict=True):
                o[mask] = column[within[mask]]
        return tuple(out)

    def unit(self, u: int) -> tuple[torch.Tensor, ...]:
        if u in self.cache:
            self.cache.move_to_end(u)
            return self.cache[u]
        columns = self.read_unit(u)
        if any(len(c) != self.sizes[u] for c in columns):
            raise DataError(
                f"row group {u} read {len(columns[0])} rows where its footer says {self.sizes[u]}; "
                "per-step fault tolerance addresses rows by position, so rows cannot be dropped "
                "(drop_nulls) or the files change while the job runs."
            )
        self.cache[u] = columns
        self.units_read += 1
        return columns

    def evict(self, keep: set[int]) -> None:
        """Drop the least recently used units beyond ``capacity_rows`` (never those in ``keep``)."""
        held = sum(self.sizes[u] for u in self.cache)
        for u in list(self.cache):
            if held <= self.capacity_rows:
                break
            if u not in keep:
                held -= self.sizes[u]
                del self.cache[u]


def cache_rows(sizes: Sequence[int], window_rows: int) -> int:
    """The rows a worker's :class:`UnitRows` keeps: two windows (a step may span two lanes' windows
    after a leave) and the largest unit of each."""
    return 2 * (max(window_rows, 1) + max(sizes, default=0))


__all__ = ["LaneOrder", "UnitRows", "cache_rows", "unit_offsets"]
