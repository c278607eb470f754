"""``distribute`` at world size 1 (outside a job) and what it returns: a real DataLoader, the
user's module behind ``unwrap``, rank 0 as the main process."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import sparkdp
from sparkdp.train.distribute import EpochSampler, sharded_loader

pytestmark = pytest.mark.timeout(60)


def _dataset(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n) % 2)


def _order(loader) -> list[int]:
    return [int(v) for x, _ in loader for v in x.squeeze(1)]


def test_the_loader_is_a_real_dataloader_with_the_users_settings():
    def collate(batch):
        return torch.stack([b[0] for b in batch]), torch.stack([b[1] for b in batch])

    user = DataLoader(_dataset(), batch_size=6, shuffle=True, drop_last=True, collate_fn=collate)
    model, optimizer, loader = sparkdp.distribute(
        nn.Linear(1, 2), torch.optim.SGD(nn.Linear(1, 2).parameters(), lr=0.1), user
    )
    assert isinstance(loader, DataLoader) and isinstance(loader.sampler, EpochSampler)
    assert loader.dataset is user.dataset and loader.batch_size == 6 and loader.drop_last
    assert loader.collate_fn is collate and len(loader) == 40 // 6
    first, second = _order(loader), _order(loader)  # no set_epoch call in between
    assert first != second and len(first) == len(second) == 36


def test_shards_cover_the_data_once_per_epoch_and_follow_set_epoch():
    user = DataLoader(_dataset(), batch_size=4, shuffle=True)
    shards = [sharded_loader(user, rank, 2, seed=3) for rank in range(2)]
    epoch0 = [_order(s) for s in shards]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(40))
    epoch1 = [_order(s) for s in shards]
    assert sorted(epoch1[0] + epoch1[1]) == list(range(40)) and epoch1 != epoch0
    for s in shards:
        s.sampler.set_epoch(0)  # a loop that calls set_epoch itself keeps control
    assert [_order(s) for s in shards] == epoch0


def test_an_unshuffled_loader_stays_in_order():
    loader = sharded_loader(DataLoader(_dataset(), batch_size=5), 0, 1, seed=0)
    assert _order(loader) == _order(loader) == list(range(40))


def test_unwrap_and_is_main_process_outside_a_job():
    inner = nn.Linear(3, 2)
    assert sparkdp.is_main_process()
    assert sparkdp.unwrap(inner) is inner
    assert set(sparkdp.unwrap(sparkdp.distribute(inner)).state_dict()) == {"weight", "bias"}
