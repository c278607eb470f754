"""Gradient accumulation under DDP on two worker processes: the same parameters as one step on
the big batch, and one all-reduce per gradient bucket per optimizer step (no_sync before)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def _train(coll, batch_size: int, accumulate: int):
    import sparkdp.strategies.allreduce as allreduce
    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train.loop import FitSpec, fit_worker
    from sparkdp.train.optim import optimizer_factory, resolve_loss

    reductions = [0]
    hook = allreduce.timed_group_hook

    def counted(state, bucket):  # noqa: ANN001, ANN202
        reductions[0] += 1
        return hook(state, bucket)

    allreduce.timed_group_hook = counted  # the hook DDP's buckets go through (process-group transport)
    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.1, momentum=0.9),
        strategy=resolve_strategy("allreduce", shared_memory=False),
        train=data,
        eval=None,
        training=TrainingConfig(epochs=2, batch_size=batch_size, accumulate=accumulate),
    )
    fit_worker(spec, coll)
    return {"params": [p.detach().clone() for p in model.parameters()], "reductions": reductions[0]}


def test_accumulate_two_of_b_equals_one_step_of_2b_with_one_reduction_per_bucket_per_step():
    big = run_workers(_train, 2, 8, 1)
    small = run_workers(_train, 2, 4, 2)
    for rank in range(2):
        for a, b in zip(small[rank]["params"], big[rank]["params"], strict=True):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), (
                f"rank {rank}: differs by {(a - b).abs().max()}"
            )
    # 64 rows / 2 workers / 8 rows a step = 4 optimizer steps an epoch, 2 epochs
    steps = 2 * 4
    for rank in range(2):
        buckets, left = divmod(big[rank]["reductions"], steps)  # one step per batch: a reduction per bucket
        assert buckets >= 1 and left == 0
        assert small[rank]["reductions"] == steps * buckets  # not 2 x: the first micro-batch ran in no_sync
