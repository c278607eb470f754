"""``sparkdp.tune``: a hyperparameter search whose trials are sparkdp jobs (``sparkdp tune`` too)."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import GROUPS, JobConfig, setting_names
from ..errors import ConfigError
from . import study as studies
from .runner import Search, SlotPool, TrialJob, summary

log = logging.getLogger(__name__)

#: ``fit_job``'s keywords besides the job's settings
FIT_KEYWORDS = ("labels", "eval_data", "loss", "optimizer", "optimizer_options", "lr_scheduler", "metric")


def run_search(
    make: Callable[[Any], TrialJob],
    *,
    trials: int,
    concurrent_trials: int = 1,
    metric: str = "test_accuracy",
    direction: str = "maximize",
    seed: int | None = None,
    sampler: str = "tpe",
    pruner: str = "median",
    storage: str | None = None,
    study_name: str | None = None,
    json_out: str | None = None,
    spark: Any = None,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Open (or continue) the study, run the trials it still lacks, and return its summary."""
    from ..config import check_int
    from ..spark.cluster import available_slots, default_workers
    from ..spark.session import session

    check_int("trials", trials)
    check_int("concurrent_trials", concurrent_trials)
    stored = studies.storage(storage)
    opened = studies.open_study(
        name=study_name,
        direction=direction,
        sampler=studies.sampler(sampler, seed),
        pruner=studies.pruner(pruner),
        storage=stored,
    )
    left = max(trials - opened.finished, 0)
    if opened.finished:
        echo(f"study {opened.study.study_name}: {opened.finished} trial(s) finished before; {left} to run")
    spark = spark or session()
    slots = SlotPool(available_slots(spark) or default_workers(spark))
    search = Search(opened.study, make, metric, spark, slots, min(concurrent_trials, max(left, 1)), echo)
    records = search.run(left) if left else []
    result = summary(opened.study, records, metric)
    if json_out:
        from ..files import atomic_write

        atomic_write(json_out, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=2, default=str)))
    if result["best"] is not None:
        echo(
            f"best: trial {result['best']['number']} {metric} {result['best']['value']:.4f} {result['best']['params']}"
        )
    return result


def tune(
    space: Callable[[Any], Mapping[str, Any] | JobConfig],
    *,
    model: Any = None,
    data: Any = None,
    trials: int = 20,
    concurrent_trials: int = 1,
    metric: str = "test_accuracy",
    direction: str = "maximize",
    seed: int | None = None,
    sampler: str = "tpe",
    pruner: str = "median",
    storage: str | None = None,
    study_name: str | None = None,
    json_out: str | None = None,
    spark: Any = None,
    echo: Callable[[str], None] = print,
    **fit_keywords: Any,
) -> dict[str, Any]:
    """Search hyperparameters with Optuna; every trial is a :func:`sparkdp.fit` job on Spark.

    Args:
        space: Optuna's define-by-run: ``space(trial)`` asks ``trial`` for values
            (``trial.suggest_float("lr", 1e-3, 0.3, log=True)``) and returns ``fit``'s keywords
            (job settings, ``optimizer_options``, ``model``, ``data``...) or a ``JobConfig``.
        model: a ``torch.nn.Module`` (each trial trains a copy) or a function building one,
            unless ``space`` returns ``model``.
        data: the training data, as for ``fit``, unless ``space`` returns it.
        trials: trials the study should have finished (a continued study counts its earlier ones).
        concurrent_trials: trials running at once, as the cluster's task slots allow.
        metric: the history key to optimise (``test_accuracy``, ``test_loss``, ``loss``...).
        direction: ``maximize`` or ``minimize``.
        seed: the sampler's seed.
        sampler: an Optuna sampler by name, with options: ``tpe``, ``random:...``, ``cmaes``...
        pruner: ``median``, ``percentile``, ``successive-halving`` (``asha``), ``hyperband``,
            ``none``, with options, e.g. ``median:n_startup_trials=2``.
        storage: an Optuna RDB URL or a journal file's path: the study continues where it stopped.
        study_name: the study's name in ``storage``.
        json_out: write the summary there.
        **fit_keywords: ``fit``'s keywords shared by every trial (``space``'s win).

    Returns:
        ``{"best": {"params", "value", "number"}, "trials": [{"params", "state", "value",
        "wall_s", "intermediate"}...], ...}``; guide: docs/guide/tuning.md.
    """

    def make(trial: Any) -> TrialJob:
        chosen = space(trial)
        if isinstance(chosen, JobConfig):
            keywords: dict[str, Any] = dict(fit_keywords)
            if _settings(keywords):
                raise ConfigError(
                    "the search space returned a JobConfig and tune was given job settings too; "
                    "put every setting in the JobConfig."
                )
            job = chosen
        elif isinstance(chosen, Mapping):
            keywords = {**fit_keywords, **chosen}
            job = JobConfig.of(_settings(keywords), caller="tune")
        else:
            raise ConfigError(
                f"the search space function must return fit's keywords (a dict) or a JobConfig; "
                f"got {type(chosen).__name__}."
            )
        built = _model(keywords.pop("model", model))
        train_data = keywords.pop("data", data)
        extra = {k: keywords.pop(k) for k in list(keywords) if k in FIT_KEYWORDS}
        if keywords:
            raise ConfigError(
                f"tune has no keyword {sorted(keywords)[0]!r}; fit's keywords and settings only."
            )
        return TrialJob(job, lambda job, **run: _fit(built, train_data, job, extra, spark, run))

    return run_search(
        make,
        trials=trials,
        concurrent_trials=concurrent_trials,
        metric=metric,
        direction=direction,
        seed=seed,
        sampler=sampler,
        pruner=pruner,
        storage=storage,
        study_name=study_name,
        json_out=json_out,
        spark=spark,
        echo=echo,
    )


def _settings(keywords: dict[str, Any]) -> dict[str, Any]:
    names = {n for cls in GROUPS.values() for n in setting_names(cls)} | set(GROUPS)
    return {k: keywords.pop(k) for k in list(keywords) if k in names}


def _model(model: Any) -> Any:
    from torch import nn

    if isinstance(model, nn.Module):
        return copy.deepcopy(model)  # every trial starts from the same weights
    if callable(model):
        return model()
    raise ConfigError(
        "tune needs model=: a torch.nn.Module or a function building one (or space returns model)."
    )


def _fit(
    model: Any, data: Any, job: JobConfig, extra: dict[str, Any], spark: Any, run: dict[str, Any]
) -> Any:
    from ..driver.api import fit_job

    return fit_job(model, data, job, spark=spark, **extra, **run)


__all__ = ["run_search", "tune"]
