"""The search's machinery without training: the slot pool, trial sizing, the
study's sampler/pruner names, and a search over trials whose training is a known function."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import optuna
import pytest

import sparkdp.tuning.tune as tuning
from sparkdp.config import JobConfig
from sparkdp.errors import ConfigError
from sparkdp.spark.cluster import oversubscription
from sparkdp.tuning import study as studies
from sparkdp.tuning.runner import Search, SlotPool, TrialJob

pytestmark = pytest.mark.timeout(60)


def test_a_trial_takes_all_its_slots_at_once_or_waits():
    pool = SlotPool(2)
    order: list[str] = []
    with pool.held(1):
        taken = threading.Event()

        def wants_two() -> None:
            with pool.held(2):
                order.append("two")
                taken.set()

        thread = threading.Thread(target=wants_two)
        thread.start()
        with pool.held(1):  # the second free slot is still there: the waiting trial took nothing
            order.append("one")
        assert not taken.wait(0.3)  # one slot is free, two are needed
        order.append("released")
    assert taken.wait(5)
    thread.join(5)
    assert order == ["one", "released", "two"]
    with pytest.raises(ConfigError, match="needs 3 task slots and the cluster has 2; search fewer"):
        with pool.held(3):
            pass


def _search(concurrent: int, total: int = 2, study=None, make=None) -> Search:
    return Search(study, make, "acc", None, SlotPool(total), concurrent, echo=lambda line: None)


@pytest.mark.parametrize(
    ("concurrent", "workers", "threads", "expected"),
    [
        (1, 1, None, (2, 2)),  # alone on 2 slots: both cores, both slots held
        (2, 1, None, (1, 1)),  # two at once: a core each
        (1, 2, None, (1, 2)),
        (2, 2, None, (1, 2)),  # two 2-worker trials on 2 slots take turns
        (1, 1, 1, (1, 1)),  # threads given: kept, and only the slots they use are held
        (1, 1, 2, (2, 2)),
    ],
)
def test_a_trials_threads_follow_its_share_of_the_slots(concurrent, workers, threads, expected):
    job = JobConfig.of({"workers": workers, **({"threads": threads} if threads else {})})
    sized, slots = _search(concurrent)._sized(job)
    assert (sized.scaling.threads, slots) == expected
    assert sized.scaling.workers == workers and not sized.monitor.show_progress


def test_threads_on_slots_the_search_holds_do_not_warn(spark):
    # spark: local[2], one core per task; a lone trial's worker runs 2 threads on the 2 slots it holds
    assert "spark.task.cpus=1" in oversubscription(spark, 1, 2)
    assert oversubscription(spark, 1, 2, reserved=2) is None
    assert "threads=3" in oversubscription(spark, 1, 3, reserved=2)


@pytest.mark.parametrize(
    ("build", "text", "message"),
    [
        (
            lambda t: studies.sampler(t, 1),
            "annealing",
            "unknown sampler 'annealing'; choose from tpe, random",
        ),
        (studies.pruner, "mean", "unknown pruner 'mean'; choose from median, percentile, successive-halving"),
        (studies.pruner, "median:n_startup_trials", "pruner option 'n_startup_trials' in"),
        (studies.pruner, "median:warmup=2", "pruner 'median:warmup=2': .*see Optuna's documentation"),
    ],
)
def test_unknown_samplers_pruners_and_options_are_refused(build, text, message):
    with pytest.raises(ConfigError, match=message):
        build(text)


def test_named_samplers_and_pruners_are_optunas_own():
    assert isinstance(studies.sampler("random", 3), optuna.samplers.RandomSampler)
    built = studies.pruner("median:n_startup_trials=2")
    assert isinstance(built, optuna.pruners.MedianPruner) and built._n_startup_trials == 2
    assert isinstance(studies.pruner("asha"), optuna.pruners.SuccessiveHalvingPruner)


def _known_training(epochs: int, calls: list):
    """Trials whose 'training' reports lr * epoch per epoch and stops when on_epoch says so, as a
    job does at its epoch boundary; lr < 0 fails as a bad setting would."""

    def make(trial):
        lr = trial.suggest_float("lr", -1.0, 1.0)

        def train(job, on_epoch, reserved_slots):
            calls.append((trial.number, job.scaling.threads, reserved_slots))
            if lr < 0:
                raise ConfigError("lr must be positive")
            history = []
            for epoch in range(1, epochs + 1):
                history.append({"epoch": epoch, "acc": lr * epoch})
                if on_epoch(history[-1]):
                    break
            return SimpleNamespace(history=history)

        return TrialJob(JobConfig.of({"workers": 1}), train)

    return make


def test_pruned_failed_and_complete_trials_are_told_to_the_study(tmp_path):
    study = optuna.create_study(direction="maximize", pruner=studies.pruner("median:n_startup_trials=2"))
    for lr in (0.5, 0.4, 0.01, -1.0, 0.48):
        study.enqueue_trial({"lr": lr})
    calls: list = []
    records = _search(1, study=study, make=_known_training(3, calls)).run(5)
    states = [(r.params["lr"], r.state, len(r.intermediate)) for r in records]
    assert states == [(0.5, "complete", 3), (0.4, "complete", 3), (0.01, "pruned", 1), (-1.0, "failed", 0),
                      (0.48, "complete", 3)]  # fmt: skip
    assert records[3].error == "ConfigError: lr must be positive"
    assert records[0].value == pytest.approx(1.5) and study.best_value == pytest.approx(1.5)
    # alone on 2 slots: 2 threads for the one worker, both slots reserved for it
    assert {(threads, slots) for _, threads, slots in calls} == {(2, 2)}


@pytest.mark.timeout(30)
def test_concurrent_trials_run_at_once_each_on_its_share():
    study = optuna.create_study(direction="maximize", sampler=studies.sampler("random", 0))
    running, most = [0], [0]
    lock = threading.Lock()

    def make(trial):
        trial.suggest_float("lr", 0.1, 1.0)

        def train(job, on_epoch, reserved_slots):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.2)
            with lock:
                running[0] -= 1
            assert (job.scaling.threads, reserved_slots) == (1, 1)
            return SimpleNamespace(history=[{"epoch": 1, "acc": 1.0}])

        return TrialJob(JobConfig.of({"workers": 1}), train)

    records = _search(2, study=study, make=make).run(4)
    assert [r.state for r in records] == ["complete"] * 4 and most[0] == 2


class _AskingTogether:
    """A study whose ``ask`` lets a second thread in before it pops a trial (a barrier both must
    reach, or 1 s): the interleaving in which SQLite hands one queued trial to both."""

    def __init__(self, study):
        self.study, self.inside, self.most = study, 0, 0
        self.lock, self.together = threading.Lock(), threading.Barrier(2, timeout=1.0)

    def ask(self):
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.together.wait()
        except threading.BrokenBarrierError:
            pass  # alone in ask: the other thread waits outside
        try:
            return self.study.ask()
        finally:
            with self.lock:
                self.inside -= 1

    def __getattr__(self, name):
        return getattr(self.study, name)


@pytest.mark.timeout(30)
def test_concurrent_trials_ask_one_at_a_time_and_never_share_a_queued_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=url, study_name="q", direction="maximize")
    lrs = [0.2, 0.7, 0.3, 0.9]
    for lr in lrs:
        study.enqueue_trial({"lr": lr})
    asking = _AskingTogether(optuna.load_study(storage=url, study_name="q"))
    calls: list = []
    records = _search(2, study=asking, make=_known_training(2, calls)).run(4)
    assert asking.most == 1
    assert sorted(r.number for r in records) == [0, 1, 2, 3]
    assert sorted(n for n, _, _ in calls) == [0, 1, 2, 3]
    done = optuna.load_study(storage=url, study_name="q").get_trials()
    assert [(t.params["lr"], t.state, t.value) for t in done] == [
        (lr, optuna.trial.TrialState.COMPLETE, pytest.approx(2 * lr)) for lr in lrs
    ]


def test_an_epoch_that_arrives_after_the_trial_ended_is_dropped():
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"lr": 0.5})
    late: list = []

    def make(trial):
        trial.suggest_float("lr", 0.0, 1.0)

        def train(job, on_epoch, reserved_slots):
            late.append(on_epoch)  # the hub's thread may still hold it when the job returns
            on_epoch({"epoch": 1, "acc": 0.5})
            return SimpleNamespace(history=[{"epoch": 1, "acc": 0.5}])

        return TrialJob(JobConfig.of({"workers": 1}), train)

    (record,) = _search(1, study=study, make=make).run(1)
    assert late[0]({"epoch": 2, "acc": 0.9}) is False  # no UpdateFinishedTrialError, no stop asked
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.COMPLETE and trial.intermediate_values == {1: 0.5}
    assert record.intermediate == {1: 0.5}


def test_a_stopped_study_resumes_without_repeating_finished_trials(spark, tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    calls: list = []
    common = {
        "trials": 2,
        "storage": url,
        "study_name": "s",
        "seed": 3,
        "spark": spark,
        "echo": lambda s: None,
    }
    first = tuning.run_search(_known_training(1, calls), metric="acc", **common)
    # a process killed mid-trial leaves it RUNNING in the storage
    left = optuna.load_study(study_name="s", storage=url).ask(
        {"lr": optuna.distributions.FloatDistribution(-1, 1)}
    )
    lines: list[str] = []
    again = tuning.run_search(
        _known_training(1, calls), metric="acc", **{**common, "trials": 3, "echo": lines.append}
    )
    trials = again["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    kept = ("number", "params", "state", "value", "intermediate")
    assert [{k: t[k] for k in kept} for t in trials[:2]] == [{k: t[k] for k in kept} for t in first["trials"]]
    assert trials[2]["state"] == "failed" and trials[2]["params"] == left.params
    assert trials[3]["params"] == left.params  # re-queued, run once more
    assert [n for n, _, _ in calls] == [0, 1, 3]  # finished trials were not trained again
    assert any("2 trial(s) finished before; 1 to run" in line for line in lines)


def test_report_draws_optunas_history_and_importances_from_the_json(spark, tmp_path):
    from sparkdp.cli.main import main
    from sparkdp.errors import DataError
    from sparkdp.tuning.plots import load_study

    def make(trial):
        lr, batch = (
            trial.suggest_float("lr", 0.1, 1.0, log=True),
            trial.suggest_categorical("batch", [32, 64]),
        )

        def train(job, on_epoch, reserved_slots):
            history = [{"epoch": e, "acc": lr * e + batch / 1000} for e in (1, 2)]
            for record in history:
                on_epoch(record)  # (pruner "none": never asks to stop)
            return SimpleNamespace(history=history)

        return TrialJob(JobConfig.of({"workers": 1}), train)

    summary = tmp_path / "t.json"
    original = tuning.run_search(
        make, metric="acc", trials=4, seed=1, spark=spark, json_out=str(summary),
        sampler="random", pruner="none", echo=lambda s: None,
    )  # fmt: skip
    read = load_study(str(summary))
    assert [(t.number, t.params, t.value, t.intermediate_values) for t in read.trials] == [
        (t["number"], t["params"], t["value"], {int(k): v for k, v in t["intermediate"].items()})
        for t in original["trials"]
    ]
    assert read.best_value == original["best"]["value"]
    assert [t["state"] for t in original["trials"]] == ["complete"] * 4
    assert main(["report", str(summary), "--out", str(tmp_path / "plots")]) == 0
    for name in ("optimization_history.png", "param_importances.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000
    (tmp_path / "bad.json").write_text('{"trials": []}')
    with pytest.raises(DataError, match="bad.json is not a sparkdp tune summary .*KeyError"):
        load_study(str(tmp_path / "bad.json"))
