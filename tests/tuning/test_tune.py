"""sparkdp.tune on the local Spark session: concurrent trials, pruning, failures, resumed studies."""

from __future__ import annotations

import json

import optuna
import pytest
import torch

import sparkdp.tuning.tune as tuning

pytestmark = pytest.mark.timeout(240)


def _data(rows: int, seed: int):
    """Ten well-separated Gaussian clusters in 16 dimensions (a linear model reaches ~100%)."""
    gen = torch.Generator().manual_seed(1234)
    centres = torch.randn(10, 16, generator=gen) * 3
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (rows,), generator=g)
    return centres[y] + torch.randn(rows, 16, generator=g), y


TRAIN, TEST = _data(4000, 1), _data(1000, 2)


def _search(spark, space, tmp_path, **more):
    lines: list[str] = []
    result = tuning.tune(
        space,
        model=lambda: torch.nn.Linear(16, 10),
        eval_data=TEST,
        workers=1,
        spark=spark,
        echo=lines.append,
        json_out=str(tmp_path / "t.json"),
        **{"data": TRAIN, "batch_size": 32, **more},
    )
    return result, lines


def _enqueued(path, name, params):
    """A journal study holding these trials, queued in order (so each test knows what runs when)."""
    storage = tuning.studies.storage(str(path))
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    for p in params:
        study.enqueue_trial(p)
    return str(path)


def lr_space(trial):
    return {"optimizer_options": {"lr": trial.suggest_float("lr", 1e-4, 0.5, log=True)}}


def test_four_trials_two_at_a_time_write_their_results_and_the_best(spark, tmp_path):
    result, lines = _search(spark, lr_space, tmp_path, trials=4, concurrent_trials=2, seed=7, epochs=1)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert [t["state"] for t in written["trials"]] == ["complete"] * 4
    for t in written["trials"]:
        assert set(t) >= {"params", "state", "value", "wall_s", "intermediate"} and t["wall_s"] > 0
        assert t["intermediate"] == {"1": t["value"]}  # the one epoch's test accuracy reached the study
    best = max(written["trials"], key=lambda t: t["value"])
    assert written["best"] == {"number": best["number"], "params": best["params"], "value": best["value"]}
    assert written["best"]["value"] > 0.9  # separable clusters
    assert sum("running" in line for line in lines) == 4 and sum("complete" in line for line in lines) == 4


def test_the_median_pruner_stops_a_clearly_bad_trial_early(spark, tmp_path):
    storage = _enqueued(tmp_path / "j.log", "prune", [{"lr": 0.1}, {"lr": 0.1}, {"lr": 1e-7}])

    result, lines = _search(
        spark,
        lambda t: {"optimizer_options": {"lr": t.suggest_categorical("lr", [0.1, 1e-7]), "momentum": 0.0}},
        tmp_path,
        trials=3,
        epochs=4,
        batch_size=16,
        storage=storage,
        study_name="prune",
        pruner="median:n_startup_trials=2",
        data=_data(6000, 3),
    )
    good, _, bad = result["trials"]
    assert good["state"] == "complete" and len(good["intermediate"]) == 4
    assert bad["params"] == {"lr": 1e-7} and bad["state"] == "pruned"
    assert len(bad["intermediate"]) < 4  # it stopped at an epoch boundary before the end
    assert any("pruning after epoch 1" in line for line in lines)


def test_a_failed_trial_is_recorded_and_the_study_completes(spark, tmp_path):
    storage = _enqueued(tmp_path / "j.log", "fail", [{"period": 2}, {"period": -1}, {"period": 4}])

    def space(trial):
        return {
            "strategy": "average",
            "strategy_options": {"period": trial.suggest_categorical("period", [2, -1, 4])},
        }

    result, _ = _search(spark, space, tmp_path, trials=3, epochs=1, storage=storage, study_name="fail")
    states = [(t["params"]["period"], t["state"]) for t in result["trials"]]
    assert states == [(2, "complete"), (-1, "failed"), (4, "complete")]
    assert "ConfigError" in result["trials"][1]["error"] and "period" in result["trials"][1]["error"]
    assert result["best"]["params"]["period"] in (2, 4)


def test_a_stopped_study_resumes_without_repeating_finished_trials(spark, tmp_path):
    storage = str(tmp_path / "study.db")
    url = f"sqlite:///{storage}"
    first, _ = _search(spark, lr_space, tmp_path, trials=2, epochs=1, seed=3, storage=url, study_name="s")
    # a process killed mid-trial leaves it RUNNING in the storage
    study = optuna.load_study(study_name="s", storage=url)
    left = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 0.5, log=True)})
    again, lines = _search(spark, lr_space, tmp_path, trials=3, epochs=1, seed=3, storage=url, study_name="s")
    trials = again["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    kept = ("number", "params", "state", "value", "intermediate")
    # finished trials kept as they were, not run again
    assert [{k: t[k] for k in kept} for t in trials[:2]] == [{k: t[k] for k in kept} for t in first["trials"]]
    assert trials[2]["state"] == "failed" and trials[2]["params"] == left.params
    assert trials[3]["state"] == "complete" and trials[3]["params"] == left.params  # re-queued
    assert any("2 trial(s) finished before; 1 to run" in line for line in lines)
