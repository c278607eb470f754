"""End-to-end fit on local[2] Spark against a single-process reference."""

import sys
import time

import pytest
import safetensors.torch
import torch
from torch import nn

import sparkdp
from sparkdp.data.tensors import TensorData
from sparkdp.errors import ConfigError, DataError

pytestmark = pytest.mark.spark


def _problem(rows=96):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 0.5, 1.5]) > 0).long()
    torch.manual_seed(0)
    return nn.Linear(4, 2), x, y


def _reference(model, x, y, *, epochs, batch, world, lr):
    """One process, plain SGD, on exactly the union batches the two shards form."""
    data = TensorData(x, y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        shards = [
            data.shard_indices(rank=r, world_size=world, epoch=epoch, seed=0, shuffle=True)
            for r in range(world)
        ]
        for start in range(0, len(shards[0]), batch):
            opt.zero_grad()
            loss = (
                sum(
                    nn.functional.cross_entropy(
                        model(x[s[start : start + batch]]), y[s[start : start + batch]]
                    )
                    for s in shards
                )
                / world
            )
            loss.backward()
            opt.step()
    return model


@pytest.mark.parametrize("strategy,options", [("allreduce", {}), ("average", {"period": 1})])
def test_fit_equals_single_process_sgd_on_union_batches(spark, strategy, options):
    model, x, y = _problem()
    ref = _reference(_problem()[0], x, y, epochs=2, batch=8, world=2, lr=0.2)
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        optimizer="sgd",
        optimizer_options={"lr": 0.2, "momentum": 0.0},
        strategy=strategy,
        strategy_options=options,
        workers=2,
        epochs=2,
        batch_size=8,
        spark=spark,
    )
    for name, p in model.state_dict().items():
        assert torch.allclose(p, ref.state_dict()[name], atol=1e-5), (
            f"{strategy}: {name} {p} vs {ref.state_dict()[name]}"
        )
    assert len(result.history) == 2 and result.history[-1]["samples"] == 96
    assert result.test_accuracy is not None and result.test_accuracy > 0.8
    assert result.samples_per_s > 0 and result.workers == 2
    if strategy == "allreduce":  # both tasks run on this host: gradients meet in /dev/shm
        assert result.strategy_options["gradient_transport"] == "shared-memory"


def test_data_shared_through_files_trains_exactly_like_data_in_the_closure(spark, tmp_path, monkeypatch):
    from sparkdp.data import shared

    monkeypatch.setattr(shared, "MIN_SHARED_BYTES", 0)  # share even this small problem
    monkeypatch.setattr(shared, "_default_base", lambda expected: tmp_path)
    written = []
    share = shared.SharedTensorDir.share
    monkeypatch.setattr(
        shared.SharedTensorDir, "share", lambda self, t: written.append(t.shape) or share(self, t)
    )
    model, x, y = _problem()
    ref = _reference(_problem()[0], x, y, epochs=2, batch=8, world=2, lr=0.2)
    sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        optimizer="sgd",
        optimizer_options={"lr": 0.2, "momentum": 0.0},
        workers=2,
        epochs=2,
        batch_size=8,
        spark=spark,
    )
    assert written == [(96, 4), (96,), (96, 4), (96,)]  # train and eval features and labels
    for name, p in model.state_dict().items():
        assert torch.allclose(p, ref.state_dict()[name], atol=1e-5), name
    assert not list(tmp_path.iterdir())  # the files went with the job


def test_trained_model_saves_and_loads_in_plain_pytorch(spark, tmp_path):
    model, x, y = _problem()
    result = sparkdp.fit(model, (x, y), workers=2, epochs=1, batch_size=16, spark=spark)
    path = result.save(tmp_path / "m.safetensors")
    fresh = nn.Linear(4, 2)
    fresh.load_state_dict(safetensors.torch.load_file(path))
    assert torch.equal(fresh.weight, model.weight)
    assert (tmp_path / "m.json").exists()


def test_unequal_shards_do_not_deadlock(spark):
    # 97 rows over 2 workers: shards are padded to 49 each, 7 batches of 8 with a short last batch
    model, x, y = _problem(97)
    result = sparkdp.fit(model, (x, y), workers=2, epochs=1, batch_size=8, spark=spark)
    assert result.history[0]["samples"] == 98


def test_the_result_says_when_rank_0s_loop_ran_around_its_training(spark):
    """``details["worker_wall"]`` (what the sync benchmark splits ``fit()`` by) lies within the
    driver's own clock around the call and holds at least the training time."""
    model, x, y = _problem(64)
    before = time.time()
    result = sparkdp.fit(model, (x, y), workers=2, epochs=2, batch_size=8, spark=spark, show_progress=False)
    after = time.time()
    wall = result.details["worker_wall"]
    assert before < wall["start"] < wall["end"] < after
    assert wall["end"] - wall["start"] >= result.train_time_s > 0


def test_eval_every_evaluates_every_kth_epoch_and_the_last(spark):
    model, x, y = _problem(64)
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x[:40], y[:40]),
        workers=2,
        epochs=3,
        batch_size=16,
        eval_every=2,
        spark=spark,
    )
    assert ["test_accuracy" in h for h in result.history] == [False, True, True]
    with torch.no_grad():  # the last epoch's metrics are those of the returned model, over all 40 rows
        want = (model(x[:40]).argmax(1) == y[:40]).float().mean().item()
    assert result.test_accuracy == pytest.approx(want)
    with pytest.raises(ConfigError, match="eval_every must be a positive integer"):
        sparkdp.fit(model, (x, y), eval_every=0, spark=spark)


def test_run_and_distribute_turn_a_plain_loop_distributed(spark):
    result = sparkdp.run(_user_loop, 0.1, workers=2, spark=spark)
    model, x, y = _problem(64)
    ref = _reference(model, x, y, epochs=2, batch=8, world=2, lr=0.1)
    # the user loop uses DistributedSampler shards, so compare quality, not bits
    assert result["world_size"] == 2 and result["batches_per_epoch"] == 4
    assert result["loss"] < 0.6 and abs(result["weight_norm"] - ref.weight.norm().item()) < 1.0


def _user_loop(lr):
    model, x, y = _problem(64)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)  # the one-line change
    for _ in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
    import torch.distributed as dist

    return {
        "world_size": dist.get_world_size(),
        "batches_per_epoch": len(loader),
        "loss": float(loss),
        "weight_norm": float(model.module.weight.norm()),
    }


def test_bad_inputs_fail_before_spark_work(spark):
    model, x, y = _problem(10)
    with pytest.raises(ConfigError, match="has 1 rows but 2 workers"):
        sparkdp.fit(model, (x[:1], y[:1]), workers=2, spark=spark)
    with pytest.raises(DataError, match=r"labels must lie in \[0, 2\).*from 0 to 7"):
        sparkdp.fit(model, (x, torch.arange(10) % 8), workers=2, spark=spark)
    with pytest.raises(ConfigError, match=r"cannot take a batch of features of shape \(2, 3\)"):
        sparkdp.fit(model, (x[:, :3], y), workers=2, spark=spark)
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        sparkdp.fit(model, (x, y), batch_size=0, spark=spark)
    with pytest.raises(ConfigError, match="Unknown optimizer 'sgdd'"):
        sparkdp.fit(model, (x, y), optimizer="sgdd", spark=spark)
    with pytest.raises(DataError, match="features have 10 rows but labels have 3"):
        sparkdp.fit(model, (x, y[:3]), spark=spark)
    with pytest.raises(ConfigError, match="Unknown dataset 'not-a-dataset-name'. Available: fashion-mnist"):
        sparkdp.fit(model, "not-a-dataset-name", spark=spark)
    with pytest.raises(
        DataError, match=r"data\['x'\] is a single value; a data dict maps each name to an array"
    ):
        sparkdp.fit(model, {"x": 1}, spark=spark)


def _argparse_main():
    """A single-machine ``main()`` that parses its own flags, as scripts do."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    args = parser.parse_args()
    return {"epochs": args.epochs, "main": sparkdp.is_main_process()}


def test_run_gives_the_workers_the_drivers_argv(spark, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "3"])
    assert sparkdp.run(_argparse_main, workers=2, spark=spark) == {"epochs": 3, "main": True}
    assert (
        sparkdp.run(_argparse_main, workers=2, spark=spark, argv=["train.py", "--epochs", "5"])["epochs"] == 5
    )
    with pytest.raises(sparkdp.WorkerFailed, match=r"sys.exit\(2\).*check the arguments the workers see"):
        sparkdp.run(_argparse_main, workers=2, spark=spark, argv=["train.py"], max_restarts=0)


def _returns(kind):
    """What a user's function returns: data of every kind ``run`` sends back, or a model object."""
    model, _, _ = _problem(8)
    if kind == "model":
        return model
    import numpy as np

    return {
        "state": model.state_dict(),
        "ids": np.arange(4, dtype=np.int32),
        "curve": (0.5, 0.25),
        "note": "done",
        "raw": b"\x00\x01",
        "none": None,
    }


def test_run_returns_data_and_names_a_result_that_is_not_data(spark):
    import numpy as np

    model, _, _ = _problem(8)
    back = sparkdp.run(_returns, "data", workers=2, spark=spark)
    assert set(back["state"]) == {"weight", "bias"}
    assert all(torch.equal(back["state"][k], v) for k, v in model.state_dict().items())
    assert back["ids"].dtype == np.int32 and back["ids"].tolist() == [0, 1, 2, 3]
    assert (back["curve"], back["note"], back["raw"], back["none"]) == (
        (0.5, 0.25),
        "done",
        b"\x00\x01",
        None,
    )
    with pytest.raises(
        ConfigError,
        match=r"the result has type torch\.nn\.modules\.linear\.Linear.*never as a "
        r"pickle.*model\.state_dict\(\).*save anything else to a file",
    ):
        sparkdp.run(_returns, "model", workers=2, spark=spark)


def test_a_master_other_than_the_running_sessions_is_refused_not_silently_swapped(spark):
    """PySpark keeps one SparkContext per process: asking for another master while one runs
    would train on the running one's. sparkdp says so instead; no master reuses the session."""
    assert sparkdp.session() is spark
    assert sparkdp.session(spark.sparkContext.master) is spark
    model, x, y = _problem()
    with pytest.raises(ConfigError, match=r"local\[2,4\] is already running.*one on local\[3\].*spark\.stop"):
        sparkdp.fit(model, (x, y), master="local[3]", epochs=1, show_progress=False)
