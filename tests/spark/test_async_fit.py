"""Asynchronous strategies end to end: parameter server on the driver, tasks on local[2] Spark."""

import pytest
import torch
from torch import nn

import sparkdp
from sparkdp.data.tensors import TensorData
from sparkdp.errors import ConfigError

pytestmark = pytest.mark.spark


def _problem(rows=256):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) > 0).long()
    torch.manual_seed(0)
    return nn.Linear(4, 2), x, y


def _torch_sgd(x, y, lr=0.3, batch=8):
    """The reference: one epoch of torch SGD on the rows in the order worker 0 of 1 sees them."""
    reference, _, _ = _problem(len(x))
    opt = torch.optim.SGD(reference.parameters(), lr=lr)
    order = TensorData(x, y).shard_indices(rank=0, world_size=1, epoch=0, seed=0, shuffle=True)
    for start in range(0, len(x), batch):
        idx = order[start : start + batch]
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
        opt.step()
    return reference


def test_one_worker_asgd_through_the_whole_stack_equals_torch_sgd(spark):
    """1 worker, push+pull every batch, tau = 0: server SGD(lr) on the worker's gradients == torch SGD."""
    model, x, y = _problem(64)
    reference = _torch_sgd(x, y)
    result = sparkdp.fit(
        model,
        (x, y),
        strategy="asgd",
        strategy_options={"rule_options": {"lr": 0.3}},
        optimizer="sgd",
        optimizer_options={"lr": 0.05, "momentum": 0.0},
        workers=1,
        epochs=1,
        batch_size=8,
        spark=spark,
    )
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), f"{p} vs {q}"
    assert result.details["server"]["pushes_applied"] == 8
    assert result.details["server"]["staleness"] == {0: 8}


@pytest.mark.parametrize(
    "strategy,options",
    [
        ("asgd", {"rule_options": {"lr": 0.1}}),
        ("hogwild", {"rule_options": {"lr": 0.1}}),
        ("easgd", {}),
        ("dcasgd", {"rule_options": {"lr": 0.1}}),
        ("ddcasgd", {"rule_options": {"lr": 0.02}}),
        ("sa-asgd", {"rule_options": {"lr": 0.1}}),
        ("asgd", {"push_every": 4, "rule_options": {"lr": 0.4}}),  # a push = mean of 4 gradients
    ],
)
def test_async_strategies_learn_and_return_the_server_parameters(spark, strategy, options):
    model, x, y = _problem()
    initial = [p.detach().clone() for p in model.parameters()]
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        strategy=strategy,
        strategy_options=options,
        optimizer="sgd",
        optimizer_options={"lr": 0.1, "momentum": 0.0},
        workers=2,
        epochs=4,
        batch_size=16,
        spark=spark,
    )
    # asynchronous runs are not deterministic; a random model sits near 0.5 on this problem
    assert result.test_accuracy > 0.85, result.history
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), initial)), (
        "got the initial model back"
    )
    per_worker = 256 // 2 // 16 * 4
    expected = 2 * per_worker // options.get("push_every", 1)
    assert result.details["server"]["pushes_applied"] == expected
    assert result.details["server"]["duplicates_dropped"] == 0 and result.details["server"]["rejected"] == 0


def test_bad_async_options_are_rejected_on_the_driver():
    with pytest.raises(ConfigError, match="push_every must be a positive number of batches or 'epoch'"):
        sparkdp.strategies.resolve_strategy("asgd", push_every=0)
    with pytest.raises(ValueError, match="alpha"):
        sparkdp.strategies.resolve_strategy("easgd", rule_options={"alpha": 1.5})
    with pytest.raises(ConfigError, match="Unknown update rule 'sgdx'"):
        sparkdp.strategies.AsyncParameterServer(rule="sgdx")


def test_async_fit_evaluates_after_every_eval_every_epoch(spark):
    """fit's promise holds for asynchronous strategies too: test metrics after epochs 2 and 4 (and the last)."""
    model, x, y = _problem()
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        strategy="asgd",
        strategy_options={"rule_options": {"lr": 0.1}},
        optimizer="sgd",
        optimizer_options={"lr": 0.1, "momentum": 0.0},
        workers=2,
        epochs=5,
        batch_size=16,
        eval_every=2,
        spark=spark,
    )
    assert ["test_accuracy" in h for h in result.history] == [False, True, False, True, True], result.history
    assert result.history[-1]["test_accuracy"] > 0.85


def _own_loop_with_distribute(x, y):
    """A user's plain loop with the one line, as sparkdp.run runs it (the model is built here)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True)
    model, opt, loader = sparkdp.distribute(model, opt, loader)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_run_with_an_async_strategy_equals_torch_sgd_for_one_worker(spark):
    """sparkdp.run + distribute under ASGD: the server starts from the worker's own model (the
    driver has none) and, with one worker pushing and pulling every step (tau = 0), the server's
    SGD(lr=0.3) on the pushed gradients is torch SGD(lr=0.3) on the same batches."""
    from sparkdp.train.distribute import sharded_loader

    _, x, y = _problem(64)
    torch.manual_seed(0)
    reference = nn.Linear(4, 2)
    opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    same_order = sharded_loader(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True),
        rank=0,
        world_size=1,
        seed=0,
    )
    for xb, yb in same_order:
        opt.zero_grad()
        nn.functional.cross_entropy(reference(xb), yb).backward()
        opt.step()
    trained = sparkdp.run(
        _own_loop_with_distribute,
        x,
        y,
        workers=1,
        strategy="asgd",
        strategy_options={"rule_options": {"lr": 0.3}},
        spark=spark,
    )
    for p, q in zip(trained, reference.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), f"{p} vs {q}"


def test_run_with_an_async_strategy_refuses_epoch_granularity(spark):
    with pytest.raises(ConfigError, match="number of batches"):
        sparkdp.run(
            _own_loop_with_distribute,
            *_problem(16)[1:],
            workers=1,
            strategy="easgd",
            strategy_options={"push_every": "epoch"},
            spark=spark,
        )


def test_run_with_servers_on_the_executors_is_refused_with_what_to_do(spark):
    with pytest.raises(ConfigError, match="sparkdp.run and `sparkdp launch` use the server on the driver"):
        sparkdp.run(
            _own_loop_with_distribute,
            *_problem(16)[1:],
            workers=1,
            strategy="asgd",
            strategy_options={"servers": 2},
            spark=spark,
        )
    with pytest.raises(ConfigError, match="servers must be None .* or a positive number of server tasks"):
        sparkdp.strategies.resolve_strategy("asgd", servers=0)


def test_when_executors_cannot_reach_the_driver_the_server_moves_to_them_and_monitoring_turns_off(
    spark, monkeypatch, caplog
):
    """The decision a Spark Connect client behind NAT needs (tests/multihost/test_connect.py has
    the real unreachable client): with the driver unreachable, one line each says that the server
    runs as a Spark task and that live monitoring is off, and the job still equals torch SGD."""
    import logging

    import sparkdp.spark.launcher as launcher

    reason = "executors on h cannot reach this process at 198.18.0.9:4242 within 5 s (OSError: [Errno 113] No route)"
    monkeypatch.setattr(launcher, "unreachable_reason", lambda spark, **_: reason)
    model, x, y = _problem(64)
    reference = _torch_sgd(x, y)
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = sparkdp.fit(
            model,
            (x, y),
            strategy="asgd",
            strategy_options={"rule_options": {"lr": 0.3}},
            optimizer="sgd",
            optimizer_options={"lr": 0.05, "momentum": 0.0},
            workers=1,
            epochs=1,
            batch_size=8,
            spark=spark,
            show_progress=True,
        )
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if "parameter server runs as a Spark task" in m] == [
        f"sparkdp: the parameter server runs as a Spark task on the executors (servers=1) instead of in this "
        f"process: {reason}"
    ], messages
    assert [m for m in messages if "live monitoring is off" in m] == [
        f"sparkdp: live monitoring is off, the executors cannot send it to this process ({reason}); each epoch's "
        f"results come back with the job when it ends"
    ], messages
    assert len(result.details["servers"]) == 1 and result.details["server"]["pushes_applied"] == 8
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p, q, atol=1e-6), f"{p} vs {q}"
