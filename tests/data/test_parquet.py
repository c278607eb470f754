"""ParquetData: row groups assigned to ranks deterministically; every row once per epoch."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparkdp.data.parquet import ParquetData
from sparkdp.errors import DataError


@pytest.fixture
def parquet_dir(tmp_path):
    """Three files, uneven row groups (one file with a single tiny group): 1000 + 37 + 250 rows."""
    start = 0
    for i, (rows, group) in enumerate([(1000, 128), (37, 100), (250, 64)]):
        ids = np.arange(start, start + rows)
        x = np.stack([ids, ids * 2], axis=1).astype(np.float32)
        table = pa.table({"x": pa.array(list(x), type=pa.list_(pa.float32())), "id": ids})
        pq.write_table(table, tmp_path / f"part-{i}.parquet", row_group_size=group)
        start += rows
    (tmp_path / "_SUCCESS").write_text("")
    return tmp_path


def _ids(data, world, epoch=0, shuffle=True, batch=32):
    per_rank = []
    for r in range(world):
        ys = [
            y
            for _x, y in data.batches(
                rank=r, world_size=world, epoch=epoch, batch_size=batch, seed=7, shuffle=shuffle
            )
        ]
        per_rank.append(torch.cat(ys) if ys else torch.empty(0, dtype=torch.long))
    return per_rank


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("epoch", [0, 3])
def test_shards_cover_every_row_once_with_equal_counts(parquet_dir, world, epoch):
    data = ParquetData(parquet_dir, features="x", label="id", shuffle_buffer=100)
    n = data.num_samples()
    assert n == 1287
    shards = _ids(data, world, epoch)
    counts = {len(s) for s in shards}
    assert len(counts) == 1, f"ranks got unequal rows {counts}"
    union = torch.cat(shards)
    assert set(union.tolist()) == set(range(n))
    assert len(union) - n == (-n) % world, "only the wrap-around padding repeats rows"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_eval_batches_count_every_row_exactly_once(parquet_dir, world):
    data = ParquetData(parquet_dir, features="x", label="id")
    ys = torch.cat(
        [y for r in range(world) for _x, y in data.eval_batches(rank=r, world_size=world, batch_size=50)]
    )
    assert sorted(ys.tolist()) == list(range(1287))


def test_features_match_rows_and_order_is_seeded_per_epoch(parquet_dir):
    data = ParquetData(parquet_dir, features="x", label="id", shuffle_buffer=64)
    for x, y in data.batches(rank=0, world_size=2, epoch=0, batch_size=16, seed=7):
        assert torch.equal(x, torch.stack([y, y * 2], 1).float())
    a0, a0_again, a1 = _ids(data, 2, 0)[0], _ids(data, 2, 0)[0], _ids(data, 2, 1)[0]
    assert torch.equal(a0, a0_again)
    assert not torch.equal(a0, a1)
    unshuffled = _ids(data, 1, 0, shuffle=False)[0]
    assert torch.equal(unshuffled, torch.arange(1287))


def test_workers_read_only_their_row_groups(parquet_dir):
    data = ParquetData(parquet_dir, features="x", label="id")
    segs = [data.segments(rank=r, world_size=3, epoch=0, seed=0, shuffle=True) for r in range(3)]
    sizes = [sum(b - a for _u, a, b in s) for s in segs]
    assert sizes == [429, 429, 429]
    cut = sum(1 for s in segs for u, a, b in s if (a, b) != (0, data.units[u][2]))
    assert cut <= 4, "at most the boundary row groups are split"


def test_errors_before_any_job(parquet_dir, tmp_path_factory):
    with pytest.raises(DataError, match=r"column 'nope' is not in the data. Available columns: x, id"):
        ParquetData(parquet_dir, features="nope", label="id")
    empty = tmp_path_factory.mktemp("empty")
    pq.write_table(
        pa.table({"x": pa.array([], pa.float32()), "id": pa.array([], pa.int64())}), empty / "e.parquet"
    )
    with pytest.raises(DataError, match="is empty"):
        ParquetData(empty, features="x", label="id")
    with pytest.raises(DataError, match="cannot open Parquet data"):
        ParquetData(tmp_path_factory.mktemp("x") / "missing.parquet", features="x", label="id")


def test_drop_nulls_counts_and_unequal_batches(tmp_path):
    table = pa.table({"x": pa.array([1.0, None, 3.0, 4.0]), "y": pa.array([0, 1, None, 1])})
    pq.write_table(table, tmp_path / "n.parquet")
    strict = ParquetData(tmp_path, features="x", label="y")
    with pytest.raises(DataError, match=r"feature column 'x' has a null value .*drop_nulls=True"):
        list(strict.batches(rank=0, world_size=1, epoch=0, batch_size=2, seed=0))
    lenient = ParquetData(tmp_path, features="x", label="y", drop_nulls=True)
    assert lenient.equal_batches is False
    ys = [y for _x, y in lenient.batches(rank=0, world_size=1, epoch=0, batch_size=2, seed=0, shuffle=False)]
    assert torch.cat(ys).tolist() == [0, 1]
    assert lenient.counters() == {"dropped_null_rows": 2}


def test_sample_reads_the_first_rows_on_the_driver(parquet_dir):
    data = ParquetData(parquet_dir, features="x", label="id")
    assert data.sample(2).num_rows == 2
    first = data.sample(data.units[0][2] + 3)  # the first record batch: at most the first row group
    assert 1 <= first.num_rows <= data.units[0][2] + 3
