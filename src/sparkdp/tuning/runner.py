"""Trials run concurrently: each a sparkdp job of its own workers, K at a time, from one driver.

Each of ``concurrent_trials`` threads asks the study for a trial, builds its job and runs it
with the driver API on the one Spark session. A barrier stage needs all its tasks at once, so
before it starts a trial takes its slots from a :class:`SlotPool` sized from the session's task
slots, all of them or none: a trial that cannot get them waits for a running one to end
instead of holding half of what it needs (two half-started barrier stages would wait on each
other). A trial's share of the cores is the slots divided by the trials running at once; its
workers get that many torch threads between them (unless ``threads`` was set).

With MLflow configured each trial's job logs into a child run of the study's (``tracking.py``).

Each epoch's results reach the trial's pruner on the driver as they arrive (``fit_job``'s
``on_epoch``); a pruned trial's job is asked to stop at its next epoch end and is recorded as
pruned. A trial whose job fails is recorded as failed and the search goes on.

Optuna's storages take calls from several threads, but popping a queued trial
(``Study.ask`` after ``enqueue_trial``, and every re-queued trial of a resumed study) reads the
trial's state and then marks it running, which SQLite does not do atomically: two threads asking
at once could both be handed the same trial, and the second to finish it would fail. So one
thread asks at a time. The epoch listener runs on the monitoring hub's thread: once the trial is
told its end, a late epoch is dropped rather than reported to a finished trial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..config import JobConfig
from ..errors import ConfigError
from .tracking import NoTracking

log = logging.getLogger(__name__)


class SlotPool:
    """Task slots handed to trials whole: :meth:`held` waits until ``n`` are free together."""

    def __init__(self, total: int) -> None:
        self.total, self._free = total, total
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def held(self, n: int) -> Iterator[None]:
        if n > self.total:
            raise ConfigError(
                f"a trial needs {n} task slots and the cluster has {self.total}; search fewer "
                "workers (the workers setting) or run on a larger cluster."
            )
        with self._changed:
            self._changed.wait_for(lambda: self._free >= n)
            self._free -= n
        try:
            yield
        finally:
            with self._changed:
                self._free += n
                self._changed.notify_all()


#: ``train(job, on_epoch=..., reserved_slots=...) -> TrainResult``: one trial's training (the
#: model and data are the caller's; the keywords are ``fit_job``'s)
Train = Callable[..., Any]


@dataclass(frozen=True)
class TrialJob:
    """What a trial trains: its job's settings and how to train it."""

    job: JobConfig
    train: Train


@dataclass
class TrialRecord:
    number: int
    params: dict[str, Any]
    state: str = "running"
    value: float | None = None
    wall_s: float = 0.0
    #: the trial's job: its whole call (start, data, training, evaluation) and its training loops
    job_s: float | None = None
    train_s: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)
    error: str | None = None

    def line(self, metric: str) -> str:
        shown = "" if self.value is None else f" {metric} {self.value:.4f}"
        why = f": {self.error}" if self.error else ""
        params = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        return f"trial {self.number:>3} {self.state:<8}{shown} [{params}] {self.wall_s:.1f} s{why}"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


@dataclass
class Search:
    """One search's settings and what its trials did."""

    study: Any
    make: Callable[[Any], TrialJob]
    metric: str
    spark: Any
    slots: SlotPool
    concurrent: int
    echo: Callable[[str], None] = print
    #: where trials are logged: NoTracking, or a StudyTracking's MLflow child runs
    tracking: Any = field(default_factory=NoTracking)
    records: list[TrialRecord] = field(default_factory=list)
    #: held while a thread asks the study for its next trial (see the module's docstring)
    _asking: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def run(self, trials: int) -> list[TrialRecord]:
        """Run ``trials`` more trials, ``concurrent`` at a time."""
        left = iter(range(trials))
        claim = threading.Lock()

        def worker() -> None:
            while True:
                with claim:
                    if next(left, None) is None:
                        return
                self._one()

        with ThreadPoolExecutor(self.concurrent, thread_name_prefix="sparkdp-trial") as pool:
            for future in [pool.submit(worker) for _ in range(min(self.concurrent, trials))]:
                future.result()
        return self.records

    def _one(self) -> None:
        from optuna.trial import TrialState

        with self._asking:
            trial = self.study.ask()
        record = TrialRecord(trial.number, {})
        self.records.append(record)
        started = time.perf_counter()
        pruned = threading.Event()
        ending = _Ending()
        try:
            planned = self.make(trial)
            record.params = dict(trial.params)
            self.echo(record.line(self.metric))
            job, slots = self._sized(self.tracking.job_for(planned.job, trial.number, record.params))
            with self.slots.held(slots):
                result = planned.train(
                    job, on_epoch=self._listener(trial, record, pruned, ending), reserved_slots=slots
                )
            record.job_s, record.train_s = (
                getattr(result, "wall_s", None),
                getattr(result, "train_time_s", None),
            )
            record.value = _final(result.history, self.metric)
        except Exception as exc:  # noqa: BLE001 - a failed trial is recorded; the search goes on
            record.params = record.params or dict(trial.params)
            record.state, record.error = "failed", f"{type(exc).__name__}: {exc}"
            log.debug("trial %d failed", trial.number, exc_info=True)
            with ending.told():
                self.study.tell(trial, state=TrialState.FAIL)
        else:
            with ending.told():
                if pruned.is_set():
                    record.state = "pruned"
                    self.study.tell(trial, state=TrialState.PRUNED)
                else:
                    record.state = "complete"
                    self.study.tell(trial, record.value)
        record.wall_s = time.perf_counter() - started
        self.echo(record.line(self.metric))
        try:
            self.tracking.trial_ended(record)
        except Exception:  # noqa: BLE001 - the study has the trial; a tracking store's hiccup ends nothing
            log.warning("sparkdp: trial %d's end could not be logged to MLflow", record.number, exc_info=True)

    def _sized(self, job: JobConfig) -> tuple[JobConfig, int]:
        """The job with its workers and torch threads fixed, and the slots it holds while it runs:
        its workers' slots and, when its share of the slots is larger, that share, whose cores its
        workers' threads use."""
        from ..spark.cluster import default_workers

        workers = job.scaling.workers or default_workers(self.spark)
        share = max(workers, self.slots.total // self.concurrent)
        threads = job.scaling.threads or max(1, share // workers)
        slots = min(max(workers, workers * threads), self.slots.total) if job.scaling.threads else share
        scaling = dataclasses.replace(job.scaling, workers=workers, threads=threads)
        monitor = dataclasses.replace(job.monitor, show_progress=False)
        return dataclasses.replace(job, scaling=scaling, monitor=monitor), slots

    def _listener(self, trial: Any, record: TrialRecord, pruned: threading.Event, ending: _Ending):
        def on_epoch(epoch: dict[str, Any]) -> bool:
            value = epoch.get(self.metric)
            with ending.open() as open_:
                if value is None or pruned.is_set() or not open_:
                    return pruned.is_set()
                step = int(epoch["epoch"])
                record.intermediate[step] = float(value)
                trial.report(float(value), step)
                if trial.should_prune():
                    pruned.set()
                    self.echo(
                        f"trial {record.number:>3} pruning after epoch {step} ({self.metric} {value:.4f})"
                    )
                return pruned.is_set()

        return on_epoch


class _Ending:
    """Orders a trial's epoch reports (the hub's thread) before its end is told (the trial's):
    a report that comes after the end finds the trial closed and is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def open(self) -> Iterator[bool]:
        """Whether the trial still takes reports, held so that its end waits for this one."""
        with self._lock:
            yield not self._closed

    @contextlib.contextmanager
    def told(self) -> Iterator[None]:
        """Close the trial to reports while its end is told."""
        with self._lock:
            self._closed = True
            yield


def _final(history: list[dict[str, Any]], metric: str) -> float:
    for record in reversed(history):
        if metric in record:
            return float(record[metric])
    keys = sorted({k for h in history for k in h})
    raise ConfigError(
        f"the metric {metric!r} is not in the job's history; it has {', '.join(keys)}. "
        "Choose one of those (test_* metrics need evaluation data)."
    )


def summary(study: Any, records: list[TrialRecord], metric: str) -> dict[str, Any]:
    """``best`` (``params``, ``value``, ``number``) and every trial of the study, as JSON data."""
    from optuna.trial import TrialState

    mine = {r.number: r for r in records}
    trials = []
    for t in study.get_trials(deepcopy=False):
        ours = mine.get(t.number)
        trials.append(
            {
                "number": t.number,
                "params": dict(t.params),
                "state": {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(
                    t.state, "failed" if t.state == TrialState.FAIL else t.state.name.lower()
                ),
                "value": t.value if t.state == TrialState.COMPLETE else None,
                "wall_s": ours.wall_s if ours else _duration(t),
                **({"job_s": ours.job_s, "train_s": ours.train_s} if ours and ours.job_s is not None else {}),
                "intermediate": {str(k): v for k, v in sorted(t.intermediate_values.items())},
                **({"error": ours.error} if ours and ours.error else {}),
            }
        )
    from optuna.distributions import distribution_to_json

    distributions = {
        k: distribution_to_json(d)
        for t in study.get_trials(deepcopy=False)
        for k, d in t.distributions.items()
    }
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    return {
        "study_name": study.study_name,
        "metric": metric,
        "direction": study.direction.name.lower(),
        "best": None if best is None else {"number": best.number, "params": best.params, "value": best.value},
        "trials": trials,
        # each parameter's Optuna distribution, as Optuna's JSON (sparkdp report draws from it)
        "distributions": distributions,
    }


def _duration(trial: Any) -> float | None:
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


__all__ = ["Search", "SlotPool", "TrialJob", "TrialRecord", "summary"]
