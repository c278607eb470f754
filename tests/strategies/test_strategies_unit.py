import pytest
import torch
from torch import nn

from sparkdp.comm import SingleProcessCollective
from sparkdp.errors import ConfigError
from sparkdp.strategies import STRATEGIES, Launcher, ParameterAveraging, resolve_strategy


def test_registry_lists_valid_names_on_a_miss():
    with pytest.raises(
        ConfigError, match="Unknown strategy 'alreduce'.*allreduce, asgd, average.*Did you mean 'allreduce'"
    ):
        resolve_strategy("alreduce")


@pytest.mark.parametrize("period", [0, -1, 1.5, "week", True])
def test_average_rejects_bad_periods(period):
    with pytest.raises(ConfigError, match="period must be a positive integer or 'epoch'"):
        ParameterAveraging(period=period)


def test_average_period_one_warns():
    with pytest.warns(UserWarning, match="allreduce"):
        ParameterAveraging(period=1)


SYNC = [e.name for e in STRATEGIES if e.create().launcher is Launcher.BARRIER]


def test_sync_and_async_strategies_are_registered():
    assert sorted(SYNC) == ["allreduce", "average", "diloco", "fsdp", "hsdp", "zero1"]
    assert {"asgd", "hogwild", "easgd", "dcasgd", "ddcasgd", "sa-asgd"} <= set(STRATEGIES.available())


def test_async_strategies_outside_a_job_say_what_starts_their_server():
    strategy = STRATEGIES.create("asgd")
    model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="needs the parameter server a sparkdp job starts"):
        strategy.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), SingleProcessCollective())


@pytest.mark.parametrize("name", SYNC)
def test_world_size_one_runs_the_same_code_as_plain_sgd(name):
    torch.manual_seed(0)
    a = nn.Linear(3, 2)
    b = nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    # DiLoCo's outer step is the identity for one worker only with plain SGD at lr 1
    options = {"average": {"period": 2}, "diloco": {"period": 2, "outer_lr": 1.0, "outer_momentum": 0.0}}
    strategy = STRATEGIES.create(name, **options.get(name, {}))
    net = strategy.setup(a, opt_a, SingleProcessCollective())
    for _ in range(3):
        for net_, opt in ((net, opt_a), (b, opt_b)):
            opt.zero_grad()
            nn.functional.cross_entropy(net_(x), y).backward()
            opt.step()
    strategy.finish()
    for p, q in zip(a.parameters(), b.parameters()):
        # g − 1·(g − θ) rounds in the last bit
        assert torch.equal(p, q) if name != "diloco" else torch.allclose(p, q, rtol=0, atol=1e-7)


STATEFUL = ["average", "diloco"]  # strategies whose schedule position must survive a restart


@pytest.mark.parametrize("name", STATEFUL)
def test_strategy_state_round_trips(name):
    strategy = STRATEGIES.create(name, period=3)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.setup(model, opt, SingleProcessCollective())
    for _ in range(4):
        opt.step()
    state = strategy.state_dict()
    assert state["steps"] == 4
    restored = STRATEGIES.create(name, period=3)
    assert restored.state_dict() != state  # a fresh one starts elsewhere: the load below must move it
    restored.load_state_dict(state)
    assert restored.state_dict() == state  # DiLoCo's outer momentum: tests/strategies/test_diloco.py


@pytest.mark.parametrize("name", [n for n in STRATEGIES.available() if n not in STATEFUL])
def test_the_other_strategies_keep_no_schedule_state(name):
    """A strategy listed here that gains state must move to STATEFUL, whose test round-trips it (an
    asynchronous strategy's state lives in its parameter server, checkpointed by the driver)."""
    strategy = STRATEGIES.create(name)
    if name in SYNC:
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy.setup(model, opt, SingleProcessCollective())
        opt.step()
    assert strategy.state_dict() == {}


def test_the_averaging_period_continues_after_a_state_round_trip():
    """4 steps, state saved; a fresh strategy loading it averages at global step 6, not at its own 3rd."""

    def run(strategy, steps):
        model = nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy.setup(model, opt, SingleProcessCollective())
        rounds = []
        strategy.average = lambda: rounds.append(strategy.state_dict()["steps"])
        for _ in range(steps):
            opt.step()
        strategy.finish()
        return rounds

    first = ParameterAveraging(period=3)
    assert run(first, 4)[:-1] == [3]  # the last round is finish()'s
    second = ParameterAveraging(period=3)
    second.load_state_dict(first.state_dict())
    assert run(second, 4)[:-1] == [6]
    with pytest.raises(ConfigError, match="'steps' must be an integer >= 0"):
        second.load_state_dict({"steps": -1})
