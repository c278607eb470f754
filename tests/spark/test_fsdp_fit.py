"""strategy='fsdp' through Spark: fit and run + distribute give allreduce's model."""

import pytest
import torch
from torch import nn

import sparkdp

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def _problem(rows=64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)), x, y


def test_fit_with_fsdp_returns_allreduce_model_and_a_memory_entry_per_worker(spark, tmp_path):
    results = {}
    for name in ("allreduce", "fsdp"):
        model, x, y = _problem()
        results[name] = sparkdp.fit(
            model,
            (x, y),
            epochs=2,
            batch_size=8,
            optimizer="adamw",
            optimizer_options={"lr": 0.01},
            strategy=name,
            workers=2,
            spark=spark,
            eval_data=(x, y),
            strategy_options={"min_params": 100} if name == "fsdp" else {},
        )
    want, got = results["allreduce"], results["fsdp"]
    for key, value in want.model.state_dict().items():
        torch.testing.assert_close(got.model.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert got.history[-1]["test_accuracy"] == pytest.approx(want.history[-1]["test_accuracy"])
    assert got.strategy_options["shard_units"] == 2  # Linear(6, 32) (224 >= 100 parameters), then the root
    memory = got.summary()["memory"]  # what the run log's summary and --json-out carry
    assert [m["worker"] for m in memory] == [0, 1] and memory == got.details["memory"]
    for mine, theirs in zip(memory, want.summary()["memory"]):  # AdamW: 2 moments per parameter
        assert 0 < mine["model_state_bytes"] <= (1 / 2 + 0.1) * theirs["model_state_bytes"]
        assert mine["peak_rss_bytes"] > 0
    path = got.save(tmp_path / "model.safetensors")  # one consolidated file
    from safetensors.torch import load_file

    assert load_file(path).keys() == want.model.state_dict().keys()


def _own_loop(x, y):
    """A user's loop with the one line; rank 0 gathers the whole sharded model to return it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    model, opt, loader = sparkdp.distribute(model, opt, loader)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return {k: v.detach().clone() for k, v in sparkdp.unwrap(model).state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def test_run_and_distribute_with_fsdp_equal_allreduce(spark):
    _, x, y = _problem()
    want = sparkdp.run(_own_loop, x, y, workers=2, strategy="allreduce", spark=spark)
    got = sparkdp.run(_own_loop, x, y, workers=2, strategy="fsdp", spark=spark)
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-5, msg=key)
