"""Which rows a step trains under a changing quorum: a row cursor over each epoch's order.

With per-step fault tolerance (``fault_tolerance="step"``) the workers that train a step change
while an epoch runs. Rank-based sharding (``data.tensors.shard_indices``) would then skip the
lost worker's rows and train a joiner's twice. Instead every step takes the next ``global_batch``
rows of the epoch's deterministic order (a seeded permutation of all rows, or storage order), and
splits them between the step's workers in rank order. A step is committed on every worker or on
none (``driver.quorum``), so the cursor, the committed steps times ``global_batch``, trains each
epoch's rows exactly once: a leave and a join change who takes them, never which are taken.

The global batch stays ``batch_size`` times the job's worker count: survivors take the lost
worker's share. Each worker scales its loss by its share of the step's rows and the gradients are
summed, so a step's gradient is the mean over the step's rows whatever the quorum (the learning
rate is unchanged). The last step of an epoch takes the rows left (no row is repeated to pad it).

Data read from files (Parquet) gives its own order (``epoch_order``, ``data.row_order``): row
groups in a seeded order, rows permuted within bounded windows, and one lane per worker slot,
so that each worker reads its own lane's row groups while the quorum is whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch


def epoch_order(rows: int, epoch: int, seed: int, shuffle: bool) -> torch.Tensor:
    """Epoch ``epoch``'s order of ``rows`` rows: the permutation every worker draws alike (the same
    seed as ``data.tensors.shard_indices``), or storage order."""
    if not shuffle:
        return torch.arange(rows)
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


class RowOrder(Protocol):
    """An epoch's order of row ids, read in contiguous slices: a tensor, or a data's own
    (``data.row_order.LaneOrder``)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice) -> torch.Tensor: ...


@dataclass(frozen=True)
class RowCursor:
    """The steps of a job over ``rows`` rows, ``global_batch`` rows a step, ``epochs`` epochs."""

    rows: int
    global_batch: int
    epochs: int
    seed: int = 0
    shuffle: bool = True
    #: the job's worker slots (a data's own order gives each its lane)
    lanes: int = 1

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.rows / self.global_batch)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def epoch_of(self, step: int) -> int:
        """The epoch (0-based) job step ``step`` (0-based) belongs to."""
        return step // self.steps_per_epoch

    def ends_epoch(self, step: int) -> bool:
        """Whether job step ``step`` is its epoch's last."""
        return (step + 1) % self.steps_per_epoch == 0

    def rows_before(self, step: int) -> int:
        """How many rows the job's first ``step`` steps train (an epoch's last step takes the rows left)."""
        epochs, within = divmod(step, self.steps_per_epoch)
        return epochs * self.rows + min(within * self.global_batch, self.rows)

    def order(self, epoch: int, data: Any = None) -> RowOrder:
        """Epoch ``epoch``'s order of the rows: ``data``'s own when it gives one (``epoch_order``:
        data read from files), else :func:`epoch_order`'s."""
        own = getattr(data, "epoch_order", None)
        if callable(own):
            order: RowOrder = own(
                epoch, self.seed, self.shuffle, lanes=self.lanes, block=self.global_batch // self.lanes
            )
            return order
        return epoch_order(self.rows, epoch, self.seed, self.shuffle)

    def step_at(self, epoch: int, rows_done: int) -> int | None:
        """The job step that starts ``rows_done`` rows into epoch ``epoch`` (a saved cursor), or
        None when no step of this cursor starts there."""
        if rows_done == 0:
            return epoch * self.steps_per_epoch
        steps, left = divmod(rows_done, self.global_batch)
        return epoch * self.steps_per_epoch + steps if not left and steps < self.steps_per_epoch else None

    def step_rows(self, step: int, order: RowOrder | None = None) -> torch.Tensor:
        """Every row of job step ``step``, over all of its workers (``order``: the epoch's, if known)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        if order is None:
            order = epoch_order(self.rows, epoch, self.seed, self.shuffle)
        start = within * self.global_batch
        return order[start : start + self.global_batch]

    def my_rows(self, step: int, rank: int, world: int, order: RowOrder | None = None) -> torch.Tensor:
        """Rank ``rank``'s rows of job step ``step`` among ``world`` workers: contiguous parts of
        the step's rows, in rank order, their sizes differing by one at most."""
        return torch.tensor_split(self.step_rows(step, order), world)[rank]


__all__ = ["RowCursor", "RowOrder", "epoch_order"]
