"""strategy='hsdp' and strategy='zero1' through Spark's barrier stage: allreduce's model."""

import pytest
import torch
from torch import nn

import sparkdp

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def _fit(spark, strategy, **options):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    return sparkdp.fit(
        model,
        (x, y),
        epochs=2,
        batch_size=8,
        optimizer="adamw",
        optimizer_options={"lr": 0.01},
        strategy=strategy,
        strategy_options=options,
        workers=2,
        spark=spark,
    )


@pytest.fixture(scope="module")
def allreduce(spark):
    return _fit(spark, "allreduce")


def _same_model(got, want):
    for key, value in want.model.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_fit_with_hsdp_shards_within_the_workers_host_and_returns_allreduces_model(spark, allreduce):
    got = _fit(spark, "hsdp", min_params=100)
    _same_model(got, allreduce)
    assert got.strategy_options["mesh"] == [1, 2]  # both tasks on this host: one shard group of 2
    for mine, theirs in zip(got.summary()["memory"], allreduce.summary()["memory"]):
        assert 0 < mine["model_state_bytes"] <= (1 / 2 + 0.1) * theirs["model_state_bytes"]


def test_fit_with_zero1_returns_allreduces_model_with_half_the_optimizer_state(spark, allreduce):
    got = _fit(spark, "zero1")
    _same_model(got, allreduce)
    assert got.strategy_options["optimizer_shards"] == 2
    for mine, theirs in zip(got.summary()["memory"], allreduce.summary()["memory"]):
        # AdamW: parameters + gradients + 2 moments under allreduce, 2 + 2/2 of 4 here
        assert mine["model_state_bytes"] <= (3 / 4 + 0.05) * theirs["model_state_bytes"]
