"""A training job's settings as frozen dataclasses: the one place their defaults and checks live.

``sparkdp.fit(...)`` keeps its keyword arguments as the friendly face and turns them into a
:class:`JobConfig`; ``sparkdp train`` takes its flags' defaults from here; a job file (a
mapping, e.g. parsed YAML) becomes one with :meth:`JobConfig.from_mapping`.  ``fit``'s and
``run``'s signature defaults are checked against these by ``tests/test_config.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


def check_int(name: str, value: Any, low: int | None = 1, *, optional: bool = False) -> None:
    """``value`` is an int (not a bool) ``>= low`` (any int when ``low`` is None), or None if optional."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        need = "an integer" if low is None else "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ConfigError(f"{name} must be {need}; got {value!r}.")


def check_memory_format(value: Any) -> str:
    if value not in MEMORY_FORMATS:
        raise ConfigError(f"memory_format must be one of {', '.join(MEMORY_FORMATS)}; got {value!r}. "
                          "'auto' trains convolutional models channels-last on CPU.")
    return value


def _positive_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a number of seconds > 0; got {value!r}.")


@dataclass(frozen=True)
class JobConfig:
    """How a job trains and where it runs (the data, model, loss and optimizer aside).

    Every field is the keyword argument of :func:`sparkdp.fit` of the same name, documented
    there, with the same default; ``sparkdp train`` flags and job-file keys map onto them.
    """

    strategy: Any = "allreduce"
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    workers: int | None = None
    epochs: int = 1
    batch_size: int = 64
    seed: int = 0
    shuffle: bool = True
    eval_every: int = 1
    memory_format: str = "auto"
    master: str | None = None
    threads: int | None = None
    start_timeout_s: float = 60.0
    pg_timeout_s: float = 60.0
    show_progress: bool = True
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    checkpoint_every_s: float | None = None
    keep_checkpoints: int = 3
    resume: str | None = None
    max_restarts: int = 3
    min_workers: int | None = None
    run_dir: str | None = None
    tensorboard: bool = False
    mlflow: str | None = None
    metrics_interval_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "keep_checkpoints"):
            check_int(name, getattr(self, name))
        for name in ("workers", "threads", "checkpoint_every", "min_workers"):
            check_int(name, getattr(self, name), optional=True)
        if self.checkpoint_every_s is not None:
            _positive_number("checkpoint_every_s", self.checkpoint_every_s)
        if self.min_workers is not None and self.workers is not None and self.min_workers > self.workers:
            raise ConfigError(f"min_workers ({self.min_workers}) cannot exceed workers ({self.workers}); "
                              "min_workers is how far an elastic restart may shrink the job.")
        check_int("max_restarts", self.max_restarts, 0)
        check_int("seed", self.seed, None)
        check_memory_format(self.memory_format)
        _positive_number("start_timeout_s", self.start_timeout_s)
        _positive_number("pg_timeout_s", self.pg_timeout_s)
        _positive_number("metrics_interval_s", self.metrics_interval_s)
        for name in ("shuffle", "show_progress", "tensorboard"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(self, name)!r}.")
        for name in ("run_dir", "mlflow", "checkpoint_dir", "resume", "master"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{name} must be a string (a path or URL); got {value!r}.")
        if self.tensorboard and self.run_dir is None:
            raise ConfigError("tensorboard=True needs run_dir (the directory its event files go to); "
                              "on the command line, --tensorboard needs --out DIR.")
        if not isinstance(self.strategy_options, Mapping):
            raise ConfigError(f"strategy_options must be a mapping of setting -> value; got "
                              f"{type(self.strategy_options).__name__}.")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> JobConfig:
        """A config from a job file's mapping; an unknown key is an error naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown job setting {key!r}; allowed: {', '.join(known)}.{hint}")
        return cls(**values)

    def defaults(self) -> dict[str, Any]:
        """The settings as a plain dict (for summaries and job files)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Columns:
    """Which columns of a Spark DataFrame or Parquet data are the features and the label.

    Attributes:
        features: the feature column, or several (concatenated per row).
        label: the label column.
        feature_shape: each row's features reshaped to this (e.g. ``(1, 28, 28)``).
        drop_nulls: drop rows with nulls instead of failing.
        shuffle_buffer: rows each worker's shuffle buffer holds.
    """

    features: Any = None
    label: str | None = None
    feature_shape: Any = None
    drop_nulls: bool = False
    shuffle_buffer: int = 10_000

    def __post_init__(self) -> None:
        if self.features is None and self.label is not None:
            raise ConfigError("label= was given without features=; name the feature column(s) too.")
        check_int("shuffle_buffer", self.shuffle_buffer)

    @property
    def given(self) -> bool:
        return self.features is not None

    def as_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


JOB_DEFAULTS = JobConfig()
COLUMN_DEFAULTS = Columns()

__all__ = ["COLUMN_DEFAULTS", "JOB_DEFAULTS", "MEMORY_FORMATS", "Columns", "JobConfig"]
