"""A search in MLflow, read back with MLflow's own client: one parent run per study, one child
run per trial (its parameters, epochs and final state), and trials running at once that each log
into their own run. The trials' training is a known function that logs through the job's own
monitoring (``driver.monitoring.monitored``: the hub and its MLflow sink), so no Spark job runs."""

from __future__ import annotations

import json
import threading

import optuna
import pytest

import sparkdp.tuning.tune as tuning
from sparkdp.config import JobConfig
from sparkdp.driver.monitoring import monitored
from sparkdp.errors import ConfigError
from sparkdp.monitor.sinks import MlflowSink
from sparkdp.tuning.runner import TrialJob
from sparkdp.tuning.tracking import PARENT_TAG

pytest.importorskip("mlflow")
pytestmark = pytest.mark.timeout(120)

SECRET_URL = "s3://AKIAKEYID:S3CR3T@bucket/data"


def _logged_training(epochs: int, between_epochs=lambda: None):
    """Trials whose 'training' reports acc = lr * epoch per epoch through the job's monitoring hub
    (what a worker's epoch record becomes on the driver), then to the pruner, stopping when it says
    so. lr = -1 is refused before the job starts (a bad value in the space); lr = -0.5 fails the job."""

    def make(trial):
        lr = trial.suggest_float("lr", -1.0, 1.0)
        if lr == -1.0:
            raise ConfigError(f"cannot read {SECRET_URL}")

        def train(job, on_epoch, reserved_slots):
            if lr < 0:
                raise RuntimeError("the job failed")
            history = []
            with monitored(job, None, 1, f"trial {trial.number}") as hub:
                assert hub is not None  # MLflow is configured: the job is monitored
                for epoch in range(1, epochs + 1):
                    history.append({"type": "epoch", "epoch": epoch, "acc": lr * epoch})
                    hub._on_report(0, history[-1])
                    between_epochs()
                    if on_epoch(history[-1]):
                        break
            return type("Result", (), {"history": history})

        return TrialJob(JobConfig.of({"workers": 1, "epochs": epochs}), train)

    return make


def _study(tmp_path, name, lrs):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=url, study_name=name, direction="maximize")
    for lr in lrs:
        study.enqueue_trial({"lr": lr})
    return url


def _runs(uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("sparkdp").experiment_id
    runs = client.search_runs([experiment], order_by=["attributes.start_time ASC"])
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = sorted(
        (r for r in runs if PARENT_TAG in r.data.tags), key=lambda r: int(r.data.tags["trial_number"])
    )
    return client, parents, children


def _history(client, run, key):
    return [
        (m.step, m.value)
        for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
    ]


def test_a_study_is_one_parent_run_with_a_child_run_per_trial(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root for a database store is ./mlruns
    lrs = [0.5, 0.4, 0.01, -1.0, -0.5, 0.48]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = tuning.run_search(
        _logged_training(3), metric="acc", trials=len(lrs), storage=_study(tmp_path, "s", lrs), study_name="s",
        pruner="median:n_startup_trials=2", seed=5, spark=spark, echo=lambda s: None, mlflow=uri,
        space="lr=uniform(-1,1)", json_out=str(tmp_path / "t.json"),
    )  # fmt: skip
    client, parents, children = _runs(uri)
    assert len(parents) == 1 and len(children) == len(lrs)
    parent = parents[0]
    assert parent.info.run_name == "s" and parent.info.status == "FINISHED"
    assert {k: parent.data.params[k] for k in ("space", "sampler", "pruner", "metric", "direction", "seed", "trials")} == {
        "space": "lr=uniform(-1,1)", "sampler": "tpe", "pruner": "median:n_startup_trials=2", "metric": "acc",
        "direction": "maximize", "seed": "5", "trials": "6",
    }  # fmt: skip
    # the best: trial 0, lr 0.5 over 3 epochs
    assert parent.data.metrics["best_value"] == pytest.approx(1.5) == result["best"]["value"]
    assert parent.data.tags["best_trial"] == "0" and parent.data.params["best.lr"] == "0.5"
    assert json.loads(parent.data.tags["best_params"]) == {"lr": 0.5}
    assert {k: parent.data.metrics[f"trials_{k}"] for k in ("complete", "pruned", "failed")} == {
        "complete": 3, "pruned": 1, "failed": 2,
    }  # fmt: skip
    assert json.loads(parent.data.params["distribution.lr"])["name"] == "FloatDistribution"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["t.json"]

    expected = ["complete", "complete", "pruned", "failed", "failed", "complete"]
    assert [c.data.tags[PARENT_TAG] for c in children] == [parent.info.run_id] * len(lrs)
    assert [c.info.run_name for c in children] == [f"trial-{n}" for n in range(len(lrs))]
    assert [float(c.data.params["lr"]) for c in children] == lrs
    assert (
        [c.data.tags["trial_state"] for c in children] == expected == [t["state"] for t in result["trials"]]
    )
    assert [c.info.status for c in children] == [
        "FINISHED",
        "FINISHED",
        "KILLED",
        "FAILED",
        "FAILED",
        "FINISHED",
    ]
    # each epoch the job logged, as its sink logs them; the pruned trial stopped after its first
    for child, lr, state in zip(children, lrs, expected):
        epochs = {"complete": 3, "pruned": 1, "failed": 0}[state]
        assert _history(client, child, "acc") == [(e, pytest.approx(lr * e)) for e in range(1, epochs + 1)]
        assert child.data.metrics.get("objective") == (pytest.approx(lr * 3) if state == "complete" else None)
    # the job's own settings beside the trial's parameters (the refused trial never had a job)
    assert children[0].data.params["epochs"] == "3" and "epochs" not in children[3].data.params
    assert "mlflow_run_id" not in children[0].data.params
    errors = [c.data.tags.get("trial_error") for c in children[3:5]]
    assert errors == ["ConfigError: cannot read s3://***@bucket/data", "RuntimeError: the job failed"]


def test_concurrent_trials_never_write_into_each_others_runs(spark, tmp_path):
    lrs = [0.2, 0.7]
    together = threading.Barrier(2, timeout=30)  # both trials log each epoch before either goes on
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = tuning.run_search(
        _logged_training(4, together.wait), metric="acc", trials=2, concurrent_trials=2,
        storage=_study(tmp_path, "c", lrs), study_name="c", pruner="none", spark=spark,
        echo=lambda s: None, mlflow=uri,
    )  # fmt: skip
    assert [t["state"] for t in result["trials"]] == ["complete", "complete"]
    client, parents, children = _runs(uri)
    assert len(parents) == 1 and [c.data.tags[PARENT_TAG] for c in children] == [parents[0].info.run_id] * 2
    for child, lr in zip(children, lrs):
        assert float(child.data.params["lr"]) == lr
        assert _history(client, child, "acc") == [(e, pytest.approx(lr * e)) for e in range(1, 5)]


def test_a_job_logs_into_a_run_it_is_given_and_leaves_it_running(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(uri, {})  # creates the sparkdp experiment
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(sink.client.get_experiment_by_name("sparkdp").experiment_id)
    run_id = run.info.run_id
    client.log_param(run_id, "lr", "0.5")
    given = MlflowSink(uri, {"lr": 0.1, "epochs": 2, "mlflow": uri, "mlflow_run_id": run_id}, run_id=run_id)
    given.write({"type": "epoch", "epoch": 1, "loss": 0.25})
    given.close()
    after = client.get_run(run_id)
    assert after.data.params == {"lr": "0.5", "epochs": "2", "mlflow": uri}  # the creator's lr kept
    assert after.data.metrics == {"loss": 0.25} and after.info.status == "RUNNING"
    with pytest.raises(ConfigError, match=r"MLflow cannot log to .*mlflow_run_id a run it holds"):
        MlflowSink(uri, {}, run_id="0" * 32)
    with pytest.raises(ConfigError, match="mlflow_run_id needs mlflow, the tracking URI its run is in"):
        JobConfig.of({"mlflow_run_id": run_id})


def test_the_parent_run_hides_credentials_and_ends_trials_left_open(tmp_path):
    from sparkdp.tuning.tracking import StudyTracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = StudyTracking(uri, "s", {"storage": "postgresql://alice:hunter2@db/optuna", "seed": None})
    job = tracking.job_for(JobConfig.of({"workers": 1}), 0, {"lr": 0.1})
    tracking.close("KILLED")  # interrupted while trial 0 ran
    client, (parent,), (child,) = _runs(uri)
    assert parent.data.params == {"storage": "postgresql://***@db/optuna"} and parent.info.status == "KILLED"
    assert job.monitor.mlflow == uri and job.monitor.mlflow_run_id == child.info.run_id
    assert child.info.status == "KILLED" and child.data.params == {"lr": "0.1"}
