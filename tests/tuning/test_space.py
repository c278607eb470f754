"""The --search grammar, parsed strictly, and the values Optuna draws from it."""

from __future__ import annotations

import math

import optuna
import pytest

from sparkdp.errors import ConfigError
from sparkdp.tuning.space import SearchParam, apply, parse_search

pytestmark = pytest.mark.timeout(30)
KNOWN = {"lr", "batch_size", "strategy", "workers"}


def test_each_distribution_parses_to_its_bounds_and_values():
    assert parse_search("lr=loguniform(0.001,0.3)", KNOWN) == SearchParam("lr", "loguniform", (0.001, 0.3))
    assert parse_search(" batch-size = int( 16 , 128 ) ", KNOWN) == SearchParam(
        "batch_size", "int", (16, 128)
    )
    assert parse_search("lr=uniform(0,1e-1)", KNOWN).values == (0.0, 0.1)
    choice = parse_search('strategy=choice(allreduce,average,"a,b",3,2.5,true)', KNOWN)
    assert choice.values == ("allreduce", "average", "a,b", 3, 2.5, True)
    assert parse_search("strategy_option.period=choice(2,8)").key == "strategy_option.period"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr", "is not of the form KEY=loguniform"),
        ("lr=normal(0,1)", "unknown distribution 'normal'"),
        ("lr=loguniform(0,1)", "loguniform needs LOW > 0"),
        ("lr=uniform(1,0.5)", "LOW must be below HIGH"),
        ("lr=uniform(0.1)", "takes two numbers; got 1"),
        ("batch_size=int(1.5,8)", "'1.5' is not an integer"),
        ("lr=uniform(__import__('os'),1)", "is not a number"),
        ("lrr=uniform(0,1)", "'lrr' is not a job setting; use one of batch_size, lr"),
        ("foo.bar=choice(1)", "a dotted KEY is strategy_option.NAME or model_option.NAME"),
        ("strategy=choice()", "needs one or more values"),
        ("strategy=choice([1,2])", "choice values are numbers"),
    ],
)
def test_bad_searches_are_refused_with_what_is_allowed(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_search(text, KNOWN)


def test_values_drawn_stay_in_range_and_log_draws_are_spread_by_magnitude():
    space = [parse_search(t, KNOWN) for t in ("lr=loguniform(0.001,1)", "batch_size=int(16,64)")]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    lrs = []
    for _ in range(200):
        trial = study.ask()
        params = {p.key: p.suggest(trial) for p in space}
        assert 0.001 <= params["lr"] <= 1 and 16 <= params["batch_size"] <= 64
        assert isinstance(params["batch_size"], int)
        lrs.append(params["lr"])
        study.tell(trial, 0.0)
    below = sum(lr < 0.01 for lr in lrs) / len(lrs)  # log-uniform: a third of the draws below 0.01
    assert math.isclose(below, 1 / 3, abs_tol=0.1)


def test_dotted_keys_set_one_entry_of_their_mapping():
    settings = {"strategy_options": {"period": 4, "x": 1}, "lr": 0.1}
    out = apply(settings, {"strategy_option.period": 8, "model_option.width": 3, "lr": 0.5})
    assert out == {"strategy_options": {"period": 8, "x": 1}, "model_options": {"width": 3}, "lr": 0.5}
    assert settings["strategy_options"] == {"period": 4, "x": 1}  # the caller's mapping is untouched
