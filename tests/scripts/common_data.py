"""The synthetic problem the example scripts train on (so the tests need no download)."""

import torch


def make_dataset(rows: int = 2400, seed: int = 0) -> torch.utils.data.TensorDataset:
    w = torch.randn(16, 4, generator=torch.Generator().manual_seed(99))  # one labelling rule for all splits
    x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(1))
