"""``sparkdp tune`` from the command line: a small search's JSON and per-trial lines, and bad
search text refused in one line before Spark starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import Cli
from .test_cli import _explain, needs_fashion


def _search_job(tmp: Path) -> Cli:
    return Cli(
        [
            "tune",
            "--dataset",
            "fashion-mnist",
            "--model",
            "linear",
            "--limit",
            "1000",
            "--workers",
            "1",
            "--epochs",
            "1",
            "--trials",
            "2",
            "--concurrent-trials",
            "2",
            "--search",
            "lr=loguniform(0.01,0.1)",
            "--search",
            "batch_size=choice(32,64)",
            "--metric",
            "test_loss",
            "--direction",
            "minimize",
            "--seed",
            "7",
            "--json-out",
            str(tmp / "t.json"),
        ],  # fmt: skip
        timeout=300,
    )


@pytest.mark.e2e
@needs_fashion
@pytest.mark.cli(build=_search_job)
def test_a_search_prints_a_line_per_trial_and_writes_the_best(cli):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    result = json.loads((cli.tmp / "t.json").read_text())
    assert result["metric"] == "test_loss" and result["direction"] == "minimize"
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["complete", "complete"]
    for t in trials:
        assert 0.01 <= t["params"]["lr"] <= 0.1 and t["params"]["batch_size"] in (32, 64)
        assert t["intermediate"] == {"1": t["value"]} and 0 < t["value"] < 2.3  # below chance's ln(10)
    assert result["best"]["value"] == min(t["value"] for t in trials)
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("trial") and " running " in line for line in lines) == 2
    assert sum(line.startswith("trial") and " complete " in line for line in lines) == 2
    assert lines[-1].startswith(f"best: trial {result['best']['number']} test_loss ")


def _bad_search(tmp: Path, search: str, message: str) -> Cli:
    return Cli(
        ["tune", "--model", "linear", "--dataset", "fashion-mnist", "--search", search], master=None, cwd=tmp
    )


@pytest.mark.e2e
@pytest.mark.cli(build=_bad_search)
@pytest.mark.parametrize(
    ("search", "message"),
    [
        ("lr=normal(0,1)", "unknown distribution 'normal'; use one of loguniform, uniform, int, choice"),
        ("learning_rate=uniform(0,1)", "'learning_rate' is not a job setting; use one of"),
    ],
)
def test_a_bad_search_is_refused_in_one_line(search, message, cli):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, _explain(proc)
