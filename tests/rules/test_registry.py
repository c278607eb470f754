"""The rule registry, validation messages, checkpoints and import hygiene of sparkdp.rules."""

from __future__ import annotations

import ast
import doctest
import importlib
import io
import json
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

import sparkdp.rules
from sparkdp.errors import ConfigError
from sparkdp.rules import ASGD, DCASGD, DDCASGD, EASGD, RULES, Push, RuleSpec, UpdateRule

from ._ref import TwoWorkerSim, assert_same

NAMES = ["asgd", "hogwild", "dynsgd", "sa-asgd", "ssgd-aware", "easgd", "easgd-deepspark", "dcasgd", "dcasgd-a",
         "dcasgd-c", "ddcasgd"]  # fmt: skip


def test_every_rule_is_registered():
    assert RULES.available() == sorted(NAMES)


def test_registry_miss_lists_every_name():
    with pytest.raises(ConfigError) as info:
        RULES.create("dc-asgd")
    for name in NAMES:
        assert name in str(info.value)


def test_rule_spec_validates_early_and_builds_fresh_instances():
    spec = RuleSpec("DDCASGD", {"num_workers": 4, "lr": 0.1})
    a, b = spec.create(), spec.create()
    assert isinstance(a, DDCASGD) and a is not b and a.tau_c == 4.0
    assert spec.create(lr=0.2).lr == 0.2
    with pytest.raises(ValueError, match="alpha"):
        RuleSpec("easgd", {"alpha": 2.0})
    with pytest.raises(ConfigError, match="Available"):
        RuleSpec("nope")


INVALID = [
    (ASGD, {"lr": -0.1}, r"`lr` must be in \(0, inf\); got -0\.1"),
    (ASGD, {"lr": 0}, r"`lr` must be in \(0, inf\); got 0"),
    (ASGD, {"server_optimizer": "sgdd"}, r"unknown server_optimizer 'sgdd'\. Available: .*adam.*sgd"),
    (ASGD, {"server_optimizer_kwargs": {"momentum": 1.0}}, r"momentum'\]` must be in \[0, 1\); got 1\.0"),
    (ASGD, {"server_optimizer_kwargs": {"nesterov": True}}, r"rejected"),
    (ASGD, {"server_optimizer_kwargs": {"lr": 0.1}}, r"as `lr=`"),
    (ASGD, {"staleness_scaling": "sqrt"}, r"staleness_scaling.*'none', 'dynsgd', 'inverse'.*'sqrt'"),
    (ASGD, {"locking": "sometimes"}, r"locking.*'none', 'global'.*'sometimes'"),
    (ASGD, {"num_workers": 0}, r"num_workers.*>= 1.*0"),
    (EASGD, {"alpha": 1.0}, r"`alpha` must be in \(0, 1\); got 1\.0.*0\.9 / num_workers"),
    (EASGD, {"alpha": 0.0}, r"`alpha` must be in \(0, 1\); got 0\.0"),
    (EASGD, {"alpha": -0.5}, r"got -0\.5"),
    (EASGD, {"alpha": float("nan")}, r"`alpha` must be in \(0, 1\)"),
    (EASGD, {"alpha": "0.5"}, r"must be a real number"),
    (EASGD, {"num_workers": 0}, r"num_workers.*>= 1"),
    (EASGD, {"variant": "sync", "num_workers": 2}, r"variant.*'async', 'deepspark'.*'sync'"),
    (EASGD, {"num_workers": 2, "server_factor": 2.0}, r"server_factor applies only"),
    (EASGD, {"variant": "deepspark", "alpha": 0.5, "server_factor": 3.0}, r"\(0, 1\]; got 1\.5"),
    (DCASGD, {"lambda_": -1.0}, r"`lambda_` must be in \[0, inf\); got -1\.0"),
    (DCASGD, {"momentum": 1.0}, r"`momentum` must be in \[0, 1\); got 1\.0"),
    (DCASGD, {"momentum": 1.5}, r"`momentum` must be in \[0, 1\); got 1\.5"),
    (DCASGD, {"variant": "b"}, r"variant.*'a', 'c'.*'b'"),
    (DCASGD, {"eps": 0.0}, r"`eps` must be in \(0, inf\)"),
    (DCASGD, {"mean_square_decay": 1.0}, r"mean_square_decay.*\[0, 1\)"),
    (DCASGD, {"lr": -1}, r"`lr` must be in \(0, inf\); got -1"),
    (DDCASGD, {"num_workers": 4, "momentum": 1.0}, r"`momentum` must be in \[0, 1\); got 1\.0"),
    (DDCASGD, {"num_workers": 4, "lambda_": -2.0}, r"`lambda_` must be in \[0, inf\); got -2\.0"),
    (DDCASGD, {"num_workers": 4, "lag_min": -1.0}, r"`lag_min`.*got -1\.0"),
    (DDCASGD, {"tau_c": 0}, r"`tau_c` must be in \(0, inf\); got 0"),
    (DDCASGD, {"num_workers": 4, "kappa": 0.0}, r"`kappa` must be in \(0, inf\); got 0\.0"),
    (DDCASGD, {}, r"pass num_workers="),
]


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"), INVALID, ids=[f"{c.__name__}-{k}" for c, k, _ in INVALID]
)
def test_invalid_hyperparameters_raise_value_error(cls, kwargs, match):
    with pytest.raises(ValueError, match=match) as info:
        cls(**kwargs)
    assert isinstance(info.value, ConfigError)


def test_degenerate_lambda_warns():
    with pytest.warns(UserWarning, match="equivalent to ASGD"):
        DCASGD(lambda_=0.0)
    with pytest.warns(UserWarning, match="no delay compensation"):
        DDCASGD(lambda_=0.0, num_workers=2)


CHECKPOINTED = [
    ("asgd", {"lr": 0.1}),
    ("asgd", {"lr": 0.01, "server_optimizer": "adam"}),
    ("asgd", {"lr": 0.1, "server_optimizer_kwargs": {"momentum": 0.9}}),
    ("hogwild", {"lr": 0.1}),
    ("sa-asgd", {"lr": 0.1}),
    ("easgd", {"num_workers": 2}),
    ("easgd-deepspark", {}),
    ("dcasgd-a", {"lr": 0.1}),
    ("dcasgd-c", {"lr": 0.1, "momentum": 0.5}),
    ("ddcasgd", {"lr": 0.1, "num_workers": 2}),
    ("ddcasgd", {"lr": 0.1, "num_workers": 1, "per_worker_mean_square": True, "lag_min": 1.0}),
]


@pytest.mark.parametrize(
    ("name", "hparams"), CHECKPOINTED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CHECKPOINTED)]
)
def test_state_dict_round_trip_reproduces_the_next_updates(name, hparams):
    rule = RULES.create(name, **hparams)
    sim = TwoWorkerSim(rule)
    sim.run(rule, 5)
    buf = io.BytesIO()  # through torch.save / weights_only load: tensors and plain values only
    torch.save({"rule": rule.state_dict(), "sim": sim.snapshot()}, buf)
    sim.run(rule, 6)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fresh = RULES.create(name, **hparams)
    fresh.load_state_dict(saved["rule"])
    sim2 = TwoWorkerSim(fresh, initial_pull=False)
    sim2.restore(saved["sim"])
    sim2.run(fresh, 6)
    assert_same(sim2.center, sim.center, f"{name} after restore")


def test_state_dict_is_a_snapshot():
    rule = DCASGD(lr=0.1, momentum=0.9, variant="c")
    centre = [torch.ones(2)]
    rule.on_pull(0, centre)
    rule.apply(centre, Push(0, 0, (torch.ones(2),)))
    state = rule.state_dict()
    rule.apply(centre, Push(0, 1, (torch.ones(2),)))
    assert torch.equal(state["momentum_buffer"]["all"][0], torch.ones(2))


def test_rules_modules_import_no_io():
    """No pyspark, sockets, pickle, threads or torch.load in sparkdp.rules (design rules 1 and 7, docs/architecture.md)."""
    code = (
        "import json, sys, torch\n"
        "before = set(sys.modules)\n"
        "import sparkdp.rules\n"
        "print(json.dumps({'new': sorted(set(sys.modules) - before), 'all': sorted(sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    mods = json.loads(out.stdout.strip().splitlines()[-1])
    assert not [m for m in mods["all"] if m.split(".")[0] == "pyspark"]
    banned = {"pyspark", "socket", "pickle", "threading", "multiprocessing", "http", "urllib"}
    assert not [m for m in mods["new"] if m.split(".")[0] in banned], mods["new"]
    for path in pathlib.Path(sparkdp.rules.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                )
                assert not {n.split(".")[0] for n in names} & banned, f"{path.name} imports {names}"
            if isinstance(node, ast.Attribute) and node.attr in {"load", "loads"}:
                pytest.fail(f"{path.name}:{node.lineno} calls .{node.attr}: rules must not deserialize")


MODULES = ["sparkdp.rules", "sparkdp.rules.functional", "sparkdp.rules.asgd", "sparkdp.rules.easgd",
           "sparkdp.rules.dcasgd", "sparkdp.rules.ddcasgd"]  # fmt: skip


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = doctest.testmod(importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_every_rule_is_an_update_rule():
    for entry in RULES:
        hp = {"num_workers": 2} if entry.name in {"easgd", "ddcasgd"} else {}
        assert isinstance(entry.create(**hp), UpdateRule)
        assert entry.description


def test_rule_specs_and_fresh_rules_pickle_for_shipping_to_executors():
    import pickle  # test-side only: the strategy may send a RuleSpec to Spark tasks

    spec = RuleSpec("asgd", {"server_optimizer": "adam", "lr": 0.01})
    assert pickle.loads(pickle.dumps(spec)) == spec
    for entry in RULES:
        hp = {"num_workers": 2} if entry.name in {"easgd", "ddcasgd"} else {}
        pickle.loads(pickle.dumps(entry.create(**hp)))
