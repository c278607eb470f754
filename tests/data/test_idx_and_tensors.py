import gzip
import struct

import numpy as np
import pytest
import torch

from sparkdp.data import DATASETS, TensorData, read_idx
from sparkdp.data.datasets import FASHION_MNIST_DIR
from sparkdp.errors import ConfigError, DataError


def _write_idx(path, array, code=0x08):
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    with gzip.open(path, "wb") if str(path).endswith(".gz") else open(path, "wb") as fh:
        fh.write(data)


def test_idx_round_trip_against_hand_built_files(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a.gz", a)
    assert np.array_equal(read_idx(tmp_path / "a.gz"), a)
    f = np.array([1.5, -2.0], dtype=np.float32)
    _write_idx(tmp_path / "f", f, code=0x0D)
    assert read_idx(tmp_path / "f").tolist() == [1.5, -2.0]


def test_idx_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_idx(tmp_path / "nope")
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    a = np.zeros((4, 2), dtype=np.uint8)
    _write_idx(tmp_path / "t", a)
    (tmp_path / "t").write_bytes((tmp_path / "t").read_bytes()[:-3])
    with pytest.raises(DataError, match=r"truncated or corrupt: header says shape \(4, 2\)"):
        read_idx(tmp_path / "t")


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist_shapes():
    ds = DATASETS.create("fashion-mnist")
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.x_train.dtype == np.float32 and 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    assert sorted(np.unique(ds.y_train)) == list(range(10))
    assert np.bincount(ds.y_test).tolist() == [1000] * 10  # the published balanced test split


@pytest.mark.parametrize("rows,world", [(10, 2), (11, 2), (7, 3), (3, 3), (2, 5)])
def test_shards_cover_every_row_and_have_equal_sizes(rows, world):
    data = TensorData(torch.arange(rows).float()[:, None], torch.arange(rows))
    shards = [
        data.shard_indices(rank=r, world_size=world, epoch=0, seed=1, shuffle=True) for r in range(world)
    ]
    assert len({len(s) for s in shards}) == 1, "every rank must get the same number of rows"
    assert set(torch.cat(shards).tolist()) == set(range(rows))
    evals = [
        torch.cat(
            [y for _, y in data.eval_batches(rank=r, world_size=world, batch_size=4)]
            or [torch.empty(0, dtype=torch.long)]
        )
        for r in range(world)
    ]
    assert sorted(torch.cat(evals).tolist()) == list(range(rows)), "evaluation counts each row once"


def test_per_epoch_shuffle_is_seeded_and_changes_between_epochs():
    data = TensorData(torch.zeros(50, 1), torch.arange(50))
    e0 = data.shard_indices(rank=0, world_size=2, epoch=0, seed=3, shuffle=True)
    assert torch.equal(e0, data.shard_indices(rank=0, world_size=2, epoch=0, seed=3, shuffle=True))
    assert not torch.equal(e0, data.shard_indices(rank=0, world_size=2, epoch=1, seed=3, shuffle=True))
    assert not torch.equal(e0, data.shard_indices(rank=0, world_size=2, epoch=0, seed=4, shuffle=True))


def test_bad_in_memory_data():
    with pytest.raises(DataError, match="empty"):
        TensorData(np.zeros((0, 2)), np.zeros(0))
    with pytest.raises(ConfigError, match="Unknown dataset 'cifar-100'"):
        DATASETS.create("cifar-100")
