"""The Optuna study of a search: its sampler, pruner and storage, and a resumed study's trials.

Samplers and pruners are Optuna's own, named ``NAME`` or ``NAME:KEY=VALUE:...`` (values as JSON,
e.g. ``median:n_startup_trials=2``) and built with those keywords. ``storage`` is an Optuna
RDB URL (``sqlite:///study.db``, ``postgresql://...``) or the path of a journal file. A study run
again under the same name continues: finished trials (complete, pruned, failed) count toward
the trials asked for, and a trial left running by a process that was stopped is marked failed
and its parameters queued again (``Study.enqueue_trial``), so it runs once more first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from ..config import key_value
from ..errors import ConfigError

log = logging.getLogger(__name__)

#: a trial this process failed because an earlier one left it running (its parameters re-queued)
REQUEUED_ATTR = "sparkdp_requeued"


def _samplers() -> dict[str, Callable[..., Any]]:
    import optuna

    return {
        "tpe": optuna.samplers.TPESampler,
        "random": optuna.samplers.RandomSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "gp": optuna.samplers.GPSampler,
        "qmc": optuna.samplers.QMCSampler,
        "nsgaii": optuna.samplers.NSGAIISampler,
    }


def _pruners() -> dict[str, Callable[..., Any]]:
    import optuna

    return {
        "median": optuna.pruners.MedianPruner,
        "percentile": optuna.pruners.PercentilePruner,
        "successive-halving": optuna.pruners.SuccessiveHalvingPruner,
        "asha": optuna.pruners.SuccessiveHalvingPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "none": optuna.pruners.NopPruner,
    }


def _built(what: str, text: str, table: dict[str, Callable[..., Any]], **defaults: Any) -> Any:
    name, *pairs = text.split(":")
    if name not in table:
        raise ConfigError(f"unknown {what} {name!r}; choose from {', '.join(table)}.")
    options = dict(defaults)
    for pair in pairs:
        if pair.find("=") < 1:
            raise ConfigError(f"{what} option {pair!r} in {text!r} must be KEY=VALUE.")
        key, value = key_value(pair)
        options[key] = value
    try:
        return table[name](**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} {text!r}: {exc}; see Optuna's documentation of {name}.") from None


def sampler(text: str, seed: int | None) -> Any:
    """An Optuna sampler by name (``tpe``, ``random``, ``cmaes``, ``gp``, ``qmc``, ``nsgaii``), seeded."""
    return _built("sampler", text, _samplers(), **({"seed": seed} if seed is not None else {}))


def pruner(text: str) -> Any:
    """An Optuna pruner by name (``median``, ``percentile``, ``successive-halving``/``asha``,
    ``hyperband``, ``none``)."""
    return _built("pruner", text, _pruners())


def storage(url: str | None) -> Any:
    """None (in memory), an RDB URL, or a journal file's path, as an Optuna storage."""
    import optuna

    if url is None:
        return optuna.storages.InMemoryStorage()
    if "://" in url:
        try:
            return optuna.storages.RDBStorage(url)
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL vary by driver
            raise ConfigError(
                f"cannot open the study storage {url!r}: {exc}. Give an RDB URL such as "
                "sqlite:///study.db, or a journal file's path."
            ) from None
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    try:
        return JournalStorage(JournalFileBackend(url))
    except OSError as exc:
        raise ConfigError(f"cannot open the study journal {url!r}: {exc.strerror or exc}.") from None


@dataclass(frozen=True)
class Opened:
    """A study and how many trials it had already finished (those re-queued left out)."""

    study: Any
    finished: int
    requeued: int


def open_study(*, name: str | None, direction: str, sampler: Any, pruner: Any, storage: Any) -> Opened:
    """Create the study, or load it from ``storage`` and re-queue the trials left running."""
    import optuna
    from optuna.trial import TrialState

    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"direction must be minimize or maximize; got {direction!r}.")
    try:
        study = optuna.create_study(
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            study_name=name,
            direction=cast(Any, direction),
            load_if_exists=True,
        )
    except ValueError as exc:  # e.g. the stored study's direction differs
        raise ConfigError(f"cannot continue the study {name!r}: {exc}") from None
    stored = study.direction.name.lower()
    if stored != direction:
        raise ConfigError(
            f"the stored study {name!r} was created to {stored}; run it with --direction {stored} "
            "or give another --study-name."
        )
    requeued = 0
    study_id = storage.get_study_id_from_name(study.study_name)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_system_attr(trial_id, REQUEUED_ATTR, True)  # (a finished trial is read-only)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        study.enqueue_trial(trial.params, skip_if_exists=False)
        requeued += 1
        log.warning("sparkdp: trial %d was left running; its parameters run again", trial.number)
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    finished = sum(
        1 for t in study.get_trials(deepcopy=False, states=done) if not t.system_attrs.get(REQUEUED_ATTR)
    )
    return Opened(study, finished, requeued)


__all__ = ["Opened", "open_study", "pruner", "sampler", "storage"]
