"""sparkdp.tune on the local Spark session: two studies of real jobs (pruning and a failed trial;
two trials at once), and a streamed DataFrame's job stopped between epochs. The search's logic
without Spark jobs (resuming, sizing, the slot pool) is tests/tuning/test_runner.py's."""

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


TRAIN, TEST = _data(2000, 1), _data(500, 2)


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


def test_two_trials_at_once_write_their_results_and_the_best(spark, tmp_path):
    def lr_space(trial):
        return {"optimizer_options": {"lr": trial.suggest_float("lr", 1e-2, 0.5, log=True)}}

    result, lines = _search(spark, lr_space, tmp_path, trials=2, concurrent_trials=2, seed=7, epochs=1)
    written = json.loads((tmp_path / "t.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert [t["state"] for t in written["trials"]] == ["complete"] * 2
    for t in written["trials"]:
        assert set(t) >= {"params", "state", "value", "wall_s", "intermediate"}
        assert t["wall_s"] >= t["job_s"] > t["train_s"] > 0  # the job inside the trial, training inside it
        assert t["intermediate"] == {"1": t["value"]}  # the one epoch's test accuracy reached the study
    best = written["trials"][written["best"]["number"]]  # (ties: Optuna keeps the first to finish)
    assert written["best"] == {"number": best["number"], "params": best["params"], "value": best["value"]}
    assert best["value"] == max(t["value"] for t in written["trials"]) > 0.9  # separable clusters
    # both started before either finished: they ran at once
    states = [line.split()[2] for line in lines if line.startswith("trial")]
    assert states == ["running", "running", "complete", "complete"], lines


def test_the_median_pruner_stops_a_bad_trial_early_and_a_failed_trial_is_recorded(spark, tmp_path):
    storage = _enqueued(
        tmp_path / "j.log",
        "prune",
        [
            {"lr": 0.1, "period": 2},
            {"lr": 0.1, "period": 2},
            {"lr": 1e-7, "period": 2},  # clearly bad: barely moves from its start
            {"lr": 0.1, "period": -1},  # a bad strategy option: the job fails
        ],
    )

    def space(trial):
        return {
            "strategy": "average",
            "strategy_options": {"period": trial.suggest_categorical("period", [2, -1])},
            "optimizer_options": {"lr": trial.suggest_categorical("lr", [0.1, 1e-7]), "momentum": 0.0},
        }

    result, lines = _search(
        spark,
        space,
        tmp_path,
        trials=4,
        epochs=3,
        storage=storage,
        study_name="prune",
        pruner="median:n_startup_trials=2",
    )
    good, _, bad, failed = result["trials"]
    assert good["state"] == "complete" and len(good["intermediate"]) == 3
    assert bad["params"]["lr"] == 1e-7 and bad["state"] == "pruned"
    assert len(bad["intermediate"]) == 1  # pruned on epoch 1's results: it trained no epoch 2
    assert any("pruning after epoch 1" in line for line in lines)
    assert failed["state"] == "failed" and "ConfigError" in failed["error"] and "period" in failed["error"]
    assert result["best"]["params"] == {"lr": 0.1, "period": 2}


def test_a_streamed_dataframe_job_asked_to_stop_starts_no_further_epoch(spark):
    from sparkdp.config import JobConfig
    from sparkdp.driver.api import fit_job

    x, y = TRAIN
    df = spark.createDataFrame(
        [(row.tolist(), int(label)) for row, label in zip(x[:600], y[:600], strict=True)],
        "x array<float>, label long",
    )
    seen: list[int] = []
    job = JobConfig.of({"workers": 1, "epochs": 4, "batch_size": 64, "features": "x", "label": "label"})
    result = fit_job(
        torch.nn.Linear(16, 10), df, job, spark=spark, on_epoch=lambda r: seen.append(r["epoch"]) or True
    )
    # asked after epoch 1: epoch 1's stage ended after the answer, so no epoch 2 stage started
    assert seen == [1] and [h["epoch"] for h in result.history] == [1]


# allreduce: every rank agrees on rank 0's answer; asgd: each asynchronous worker asks for itself
@pytest.mark.parametrize(
    ("strategy", "options"), [("allreduce", {}), ("asgd", {"rule_options": {"lr": 0.05}})]
)
def test_a_job_asked_to_stop_after_an_epoch_trains_no_further_epoch(spark, strategy, options):
    from sparkdp.config import JobConfig
    from sparkdp.driver.api import fit_job

    seen: list[int] = []
    job = JobConfig.of({"workers": 2, "epochs": 4, "batch_size": 64, "strategy": strategy,
                        "strategy_options": options, "threads": 1})  # fmt: skip
    result = fit_job(
        torch.nn.Linear(16, 10), TRAIN, job, spark=spark, eval_data=TEST,
        on_epoch=lambda r: seen.append(r["epoch"]) or r["epoch"] >= 2,
    )  # fmt: skip
    # pruned on epoch 2's results: the job ends after epoch 2 (not 3), with its test accuracy
    assert seen == [1, 2] and [h["epoch"] for h in result.history] == [1, 2]
    assert result.history[-1]["test_accuracy"] > 0.5


def test_a_real_trial_logs_its_epochs_into_its_child_run(spark, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from sparkdp.tuning.tracking import PARENT_TAG

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root for a database store is ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def lr_space(trial):
        return {"optimizer_options": {"lr": trial.suggest_float("lr", 1e-2, 0.5, log=True)}}

    result, _ = _search(spark, lr_space, tmp_path, trials=1, seed=7, epochs=2, mlflow=uri, pruner="none")
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("sparkdp").experiment_id])
    (parent,) = [r for r in runs if PARENT_TAG not in r.data.tags]
    (child,) = [r for r in runs if PARENT_TAG in r.data.tags]
    assert child.data.tags[PARENT_TAG] == parent.info.run_id and child.info.status == "FINISHED"
    assert (
        parent.data.params["space"]
        == f"{__name__}.test_a_real_trial_logs_its_epochs_into_its_child_run.<locals>.lr_space"
    )
    (trial,) = result["trials"]
    assert float(child.data.params["lr"]) == trial["params"]["lr"] and child.data.params["workers"] == "1"
    # the workers' epoch records, as the job's sink logs them: what the study was told per epoch
    accuracy = sorted(client.get_metric_history(child.info.run_id, "test_accuracy"), key=lambda m: m.step)
    assert {str(m.step): m.value for m in accuracy} == trial["intermediate"] and len(accuracy) == 2
    assert parent.data.metrics["best_value"] == trial["value"] == accuracy[-1].value
