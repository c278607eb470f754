"""``sparkdp tune``: a hyperparameter search over ``sparkdp train`` jobs (sparkdp.tuning)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
from typing import Any

from ..config import setting
from ..errors import ConfigError
from .fields import add_job_settings
from .train_cmd import settings_classes


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """The search: its space, trials, objective, sampler, pruner and storage.

    Attributes:
        search: one dimension of the search: KEY=loguniform(LOW,HIGH), uniform(LOW,HIGH), int(LOW,HIGH) or choice(A,B,...); KEY is any setting of sparkdp train (lr, batch_size, strategy, workers...), strategy_option.NAME or model_option.NAME.
        trials: trials the study should have finished (a continued study counts its earlier ones).
        concurrent_trials: trials running at once, each on its own workers, as the task slots allow.
        metric: the history key to optimise, e.g. test_accuracy, test_loss, test_perplexity, loss.
        direction: maximize or minimize the metric.
        sampler: an Optuna sampler: tpe, random, cmaes, gp, qmc or nsgaii, with options as NAME:KEY=VALUE.
        pruner: an Optuna pruner: median, percentile, successive-halving (asha), hyperband or none, with options as NAME:KEY=VALUE (e.g. median:n_startup_trials=2).
        storage: an Optuna RDB URL (sqlite:///study.db) or a journal file's path; a study run again continues where it stopped.
        study_name: the study's name in the storage.
    """

    search: Any = setting(None, action="append", metavar="KEY=DIST(...)")
    trials: int = setting(20, metavar="N")
    concurrent_trials: int = setting(1, metavar="K")
    metric: str = setting("test_accuracy", metavar="KEY")
    direction: str = setting("maximize", choices=("maximize", "minimize"))
    sampler: str = setting("tpe", metavar="NAME")
    pruner: str = setting("median", metavar="NAME")
    storage: str | None = setting(None, metavar="URL|FILE")
    study_name: str | None = setting(None, metavar="NAME")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="search hyperparameters with Optuna, trials running concurrently on Spark",
        description="Run a hyperparameter search whose trials are sparkdp train jobs (every train flag "
        "sets what the trials share; --search what they vary), several at once as the cluster's "
        "task slots allow, pruned per epoch; --json-out writes the best and every trial.",
        epilog="example:\n  sparkdp tune --dataset fashion-mnist --model cnn-small --workers 1 --epochs 1 "
        "--limit 6000 --trials 6 --concurrent-trials 2 --search 'lr=loguniform(0.001,0.3)' "
        "--metric test_accuracy --direction maximize --seed 7 --json-out t.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_settings(p, (*settings_classes(), (TuneOptions, None)), run)


def _known() -> set[str]:
    return {
        f.name
        for cls, _ in settings_classes()
        for f in dataclasses.fields(cls)
        if not f.metadata.get("positional") and f.name != "json_out"
    }


def run(args) -> int:
    import sparkdp

    from ..tuning.space import apply, parse_search
    from ..tuning.tune import run_search
    from .train_cmd import prepare

    space = [parse_search(text, _known()) for text in args.search or ()]
    if not space:
        raise ConfigError(
            "give at least one --search KEY=DIST(...), e.g. --search 'lr=loguniform(0.001,0.3)'."
        )
    prepare(args)  # the shared settings checked once, before any trial (and before Spark starts)
    spark = sparkdp.session(args.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN")

    def make(trial):
        from ..tuning.runner import TrialJob

        params = {p.key: p.suggest(trial) for p in space}
        trial_args = copy.copy(args)
        for key, value in apply({}, params).items():
            if isinstance(value, dict):
                value = {**(getattr(args, key) or {}), **value}
            setattr(trial_args, key, value)
        if args.run_dir:
            trial_args.run_dir = f"{args.run_dir}/trial-{trial.number}"
        prepared = prepare(trial_args)
        return TrialJob(prepared.job, lambda job, **run: prepared.fit(job, spark, **run))

    result = run_search(
        make,
        trials=args.trials if args.trials is not None else 20,
        concurrent_trials=args.concurrent_trials if args.concurrent_trials is not None else 1,
        metric=args.metric or "test_accuracy",
        direction=args.direction or "maximize",
        seed=args.seed,
        sampler=args.sampler or "tpe",
        pruner=args.pruner or "median",
        storage=args.storage,
        study_name=args.study_name,
        json_out=args.json_out,
        spark=spark,
    )
    return 0 if result["best"] is not None else 1
