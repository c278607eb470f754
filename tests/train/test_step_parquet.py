"""Per-step fault tolerance on Parquet data, in one process: the row cursor over row groups
(``data.row_order``), real workers as threads against the driver's real quorum endpoint, a leave
and a join. The rows are counted by the feature values the workers decoded from the files (each
row's feature is its position over the row count), not by the ids the cursor asked for."""

from __future__ import annotations

import copy
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from sparkdp.config import TrainingConfig
from sparkdp.data.parquet import ParquetData
from sparkdp.data.row_order import LaneOrder, cache_rows
from sparkdp.strategies import resolve_strategy
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory
from tests.train.test_step_worker import leave_and_join

pytestmark = pytest.mark.timeout(120)

ROWS, BATCH, WORKERS, EPOCHS = 600, 4, 3, 2  # 50 steps an epoch


def write_ids(path, rows: int, row_group: int) -> str:
    """A Parquet file whose row i has feature i / rows and label i % 2, ``row_group`` rows a group."""
    ids = torch.arange(rows)
    table = pa.table({"f": (ids / rows).float().numpy(), "y": (ids % 2).numpy()})
    pq.write_table(table, path, row_group_size=row_group)
    return str(path)


class NotingParquet(ParquetData):
    """Parquet data that notes the rows it read since ``last`` was emptied, by their features."""

    last: list[int] = []

    def rows_at(self, ids):
        x, y = super().rows_at(ids)
        self.last = [*self.last, *torch.round(x[:, 0] * ROWS).long().tolist()]
        return x, y


def _spec(path: str, strategy: str = "allreduce", **options) -> FitSpec:
    torch.manual_seed(0)
    return FitSpec(
        model=nn.Linear(1, 2),
        loss=nn.functional.cross_entropy,
        optimizer=optimizer_factory("sgd", None, lr=0.01),
        strategy=resolve_strategy(strategy, **options),
        train=NotingParquet(path, features="f", label="y", shuffle_buffer=100),
        eval=None,
        training=TrainingConfig(epochs=EPOCHS, batch_size=BATCH, seed=3),
    )


def test_an_epochs_order_is_every_row_once_and_a_whole_quorums_rank_reads_its_lane(tmp_path) -> None:
    rows, unit, window, workers, block = 6000, 50, 100, 3, 16
    data = ParquetData(
        write_ids(tmp_path / "d.parquet", rows, unit), features="f", label="y", shuffle_buffer=window
    )
    order = data.epoch_order(1, 7, True, lanes=workers, block=block)
    assert sorted(order[0:rows].tolist()) == list(range(rows))
    assert order[0:rows].tolist() != data.epoch_order(2, 7, True, lanes=workers, block=block)[0:rows].tolist()
    assert torch.equal(torch.cat([order[a : a + 48] for a in range(0, rows, 48)]), order[0:rows])
    for rank in range(workers):  # each rank's own copy, as each worker has
        mine = copy.deepcopy(data)
        for start in range(0, rows, workers * block):
            ids = order[start : start + workers * block]
            x, y = mine.rows_at(torch.tensor_split(ids, workers)[rank])
            assert torch.equal(torch.round(x[:, 0] * rows).long(), torch.tensor_split(ids, workers)[rank])
            assert torch.equal(y, torch.tensor_split(ids, workers)[rank] % 2)
        reader = mine.row_reader
        assert reader.units_read <= rows // unit // workers + 6  # its lane's row groups, a few at its ends
        assert sum(len(c[0]) for c in reader.cache.values()) <= cache_rows(data.unit_rows(), window)


def test_without_shuffling_a_lane_is_storage_order() -> None:
    order = LaneOrder([4, 4, 2], epoch=0, seed=1, shuffle=False, window_rows=0, lanes=2, block=2)
    assert order[0:10].tolist() == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9]  # lanes 0-4 and 5-9, 2 rows each a step


@pytest.mark.parametrize(("strategy", "options"), [("allreduce", {}), ("diloco", {"period": 2})])
def test_each_epochs_parquet_rows_are_trained_once_across_a_leave_and_a_join(
    tmp_path, strategy, options
) -> None:
    spec = _spec(write_ids(tmp_path / "d.parquet", ROWS, 37), strategy, **options)
    quorum, _, seen, replacement, _ = leave_and_join(spec, strategy)
    assert [(r["worker"], r["kind"]) for r in quorum.records] == [(1, "leave"), (1, "join")]
    for epoch in range(EPOCHS):
        counted = Counter()
        for counts in (*seen.values(), replacement):
            counted.update(counts.get(epoch, Counter()))
        assert counted == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
