"""A training job's settings, grouped by concern as frozen dataclasses: the one place each
setting's name, type, default, check and help text is written.

Everything else is derived from these classes: ``sparkdp.fit``'s keywords (any field, by
name, mapped by :meth:`JobConfig.of`), the ``sparkdp train``/``launch`` flags and the YAML job
files (``sparkdp.cli.fields`` reads the fields' types, defaults and the ``Attributes:`` section
of each class's docstring). A field added here is a keyword, a flag and a job-file key at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .errors import ConfigError
from .redact import redact

MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
#: what ``precision`` may be; what each means is ``sparkdp.train.precision``'s
PRECISIONS = ("32", "bf16-mixed", "fp16-mixed")
#: the named learning-rate schedules (``sparkdp.train.schedule``); "constant" is no schedule
LR_SCHEDULES = ("constant", "warmup-cosine")
#: what a lost worker costs a synchronous job (``FailureConfig.fault_tolerance``)
FAULT_TOLERANCE_MODES = ("restart", "step")
#: a job's identity, as its checkpoints' names carry it (train.checkpoint_store) and resume_job gives it
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    negative: tuple[str, ...] = (),
    choices: tuple[Any, ...] | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    positional: bool = False,
    action: Any = None,
) -> Any:
    """A dataclass field with how it appears on the command line.

    ``flag`` replaces the ``--field-name`` spelling; ``aliases`` are further spellings (also
    accepted as job-file keys); ``negative`` are flags that set a bool field to False;
    ``parse`` turns a flag's text into the value (a job file gives typed YAML values);
    ``positional`` makes it an optional positional argument; ``action`` an argparse action."""
    meta = {
        "flag": flag,
        "aliases": aliases,
        "negative": negative,
        "choices": choices,
        "metavar": metavar,
        "parse": parse,
        "positional": positional,
        "action": action,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def field_docs(cls: type) -> dict[str, str]:
    """``{field: help}`` from the ``Attributes:`` sections of ``cls``'s docstring and its bases'."""
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        inside, name = False, None
        for line in (klass.__dict__.get("__doc__") or "").splitlines():
            if line.strip() == "Attributes:":
                inside = True
            elif inside and not line.strip():
                break
            elif inside and (entry := re.match(r"\s{8}(\w+): (.*)", line)) and entry.group(1) in names:
                name = entry.group(1)
                docs[name] = entry.group(2).strip()
            elif inside and name is not None:
                docs[name] += " " + line.strip()
    return docs


def check_int(name: str, value: Any, low: int | None = 1, *, optional: bool = False) -> None:
    """``value`` is an int (not a bool) ``>= low`` (any int when ``low`` is None), or None if optional."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        need = "an integer" if low is None else "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ConfigError(f"{name} must be {need}; got {value!r}.")


def check_memory_format(value: Any) -> str:
    if value not in MEMORY_FORMATS:
        raise ConfigError(
            f"memory_format must be one of {', '.join(MEMORY_FORMATS)}; got {value!r}. "
            "'auto' trains convolutional models channels-last on CPU."
        )
    return value


def check_seconds(name: str, value: Any, *, optional: bool = False) -> None:
    """``value`` is a number (not a bool) of seconds > 0, or None if optional."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be a number of seconds > 0; got {value!r}.")


def _flags(obj: Any, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise ConfigError(f"{name} must be true or false; got {getattr(obj, name)!r}.")


def _paths(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"{name} must be a string (a path or URL); got {value!r}.")


def key_value(text: str) -> tuple[str, Any]:
    """A mapping flag's ``KEY=VALUE`` (the value read as JSON when it is, e.g. ``period=4``,
    ``anon=true``; ``'key="123"'`` keeps a string of digits a string) → ``(KEY, VALUE)``."""
    import json

    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise ConfigError(
            f"expected KEY=VALUE (e.g. period=4 or endpoint_url=http://host:9000); got {text!r}. "
            "Give one option per flag, its name before the first '='."
        )
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


@dataclass(frozen=True)
class TrainingConfig:
    """What is trained how: the update strategy and the training loop.

    Attributes:
        strategy: how workers combine their work: allreduce, average, diloco, or an asynchronous rule (asgd, hogwild, easgd, dcasgd, ddcasgd); or a Strategy object.
        strategy_options: the strategy's settings, e.g. {"period": 4}.
        epochs: passes over the training data.
        batch_size: rows per worker per step; the global batch is workers * batch_size.
        seed: the seed of the data shuffles and of every worker's random streams.
        shuffle: shuffle the training data every epoch.
        eval_every: evaluate after every this many epochs, and after the last.
        memory_format: layout of conv weights and image batches: auto (channels_last for convolutional models on CPU), channels_last or contiguous.
        precision: 32 (float32), bf16-mixed (forward passes under bfloat16 autocast, CPU and CUDA) or fp16-mixed (float16 autocast with gradient scaling, CUDA only); parameters and optimizer state stay float32.
        accumulate: micro-batches per optimizer step: gradients of this many batches are added up (each loss scaled by 1/accumulate) before one step, so a step sees accumulate * batch_size rows per worker.
        clip_grad_norm: clip the gradients' total 2-norm to at most this before every optimizer step (after they are synchronised); unset: no clipping.
        lr_schedule: the learning rate over the job's optimizer steps: constant, or warmup-cosine (a linear rise to the optimizer's lr over warmup_steps, then a cosine decay to min_lr_ratio times it at the last step).
        warmup_steps: optimizer steps of linear warmup (warmup-cosine).
        min_lr_ratio: the lr at the end of the cosine decay, as a fraction of the optimizer's lr (warmup-cosine).
    """

    strategy: Any = setting("allreduce")
    strategy_options: Mapping[str, Any] = setting(
        factory=dict, flag="--strategy-option", metavar="KEY=VALUE", parse=key_value
    )
    epochs: int = setting(1)
    batch_size: int = setting(64)
    seed: int = setting(0)
    shuffle: bool = setting(True)
    eval_every: int = setting(1, metavar="K")
    memory_format: str = setting("auto", choices=MEMORY_FORMATS)
    precision: str = setting("32", choices=PRECISIONS)
    accumulate: int = setting(1, metavar="N")
    clip_grad_norm: float | None = setting(None, metavar="NORM")
    lr_schedule: str = setting("constant", choices=LR_SCHEDULES)
    warmup_steps: int = setting(0, metavar="STEPS")
    min_lr_ratio: float = setting(0.0, metavar="R")

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every", "accumulate"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, None)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_memory_format(self.memory_format)
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}. "
                "bf16-mixed runs on CPUs and GPUs, fp16-mixed on CUDA GPUs only."
            )
        if self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(
                f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}; got {self.lr_schedule!r}. "
                "For any other schedule pass fit(lr_scheduler=optimizer -> scheduler)."
            )
        if self.clip_grad_norm is not None and (
            isinstance(self.clip_grad_norm, bool)
            or not isinstance(self.clip_grad_norm, (int, float))
            or not self.clip_grad_norm > 0
        ):
            raise ConfigError(
                f"clip_grad_norm must be a number > 0 (the largest gradient norm allowed) or unset; "
                f"got {self.clip_grad_norm!r}."
            )
        ratio = self.min_lr_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise ConfigError(
                f"min_lr_ratio must be a number in [0, 1] (the final lr as a fraction of the "
                f"optimizer's); got {ratio!r}."
            )
        _flags(self, "shuffle")
        if not isinstance(self.strategy_options, Mapping):
            raise ConfigError(
                f"strategy_options must be a mapping of setting -> value; got "
                f"{type(self.strategy_options).__name__}."
            )


@dataclass(frozen=True)
class ScalingConfig:
    """Where the job runs and on how many workers.

    Attributes:
        workers: Spark tasks to train on (default: every task slot of a local master, or of the executors registered when the job starts; 2 while none has).
        master: a Spark master URL, or sc://host:port for a Spark Connect server (default: $SPARK_REMOTE if set, else the embedded local[N] session).
        threads: torch threads per worker (default: spark.task.cpus).
    """

    workers: int | None = setting(None)
    master: str | None = setting(None)
    threads: int | None = setting(None)

    def __post_init__(self) -> None:
        check_int("workers", self.workers, optional=True)
        check_int("threads", self.threads, optional=True)
        _paths(self, "master")


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints: where, how often, how many, and where to resume from.

    Attributes:
        checkpoint_dir: where synchronous jobs save checkpoints (a directory or an fsspec URL such as s3://bucket/run; at every epoch end at least), asynchronous ones the parameter servers' state; unset, a temporary directory serves automatic recovery only.
        checkpoint_every: also save every this many steps of an epoch.
        checkpoint_every_s: also save when this many seconds have passed.
        keep_checkpoints: how many of the newest checkpoints to keep.
        resume: a checkpoint directory: continue from its newest valid checkpoint.
        resume_job: the job to continue when the resume directory holds several jobs' checkpoints: its identity, the last part of its checkpoints' names (ckpt-e00002-s00000000-JOB.safetensors); unset, a directory of several jobs is refused with their identities.
        checkpoint_storage_options: options for the checkpoint directory's fsspec filesystem (e.g. endpoint_url=http://host:9000 for an S3-compatible store); they travel to the executors with the job.
    """

    checkpoint_dir: str | None = setting(None, metavar="DIR")
    checkpoint_every: int | None = setting(None, metavar="STEPS")
    checkpoint_every_s: float | None = setting(None, metavar="S")
    keep_checkpoints: int = setting(3, metavar="K")
    resume: str | None = setting(None, metavar="DIR")
    resume_job: str | None = setting(None, metavar="JOB")
    checkpoint_storage_options: dict[str, Any] | None = setting(None, metavar="KEY=VALUE", parse=key_value)

    def __post_init__(self) -> None:
        check_int("checkpoint_every", self.checkpoint_every, optional=True)
        check_int("keep_checkpoints", self.keep_checkpoints)
        check_seconds("checkpoint_every_s", self.checkpoint_every_s, optional=True)
        _paths(self, "checkpoint_dir", "resume")
        if self.resume_job is not None and (
            not isinstance(self.resume_job, str) or not JOB_ID.fullmatch(self.resume_job)
        ):
            raise ConfigError(
                f"resume_job={self.resume_job!r}: expected a job's identity, 1-64 letters, digits, '_' "
                "or '-' (the last part of its checkpoints' names, ckpt-e00002-s00000000-JOB.safetensors)."
            )
        if self.resume_job is not None and self.resume is None:
            raise ConfigError(
                f"resume_job={self.resume_job!r} names the job to continue from resume's directory; "
                "give resume=DIR (--resume DIR) too, or leave resume_job unset."
            )
        options = self.checkpoint_storage_options
        if options is not None and not (
            isinstance(options, Mapping) and all(isinstance(k, str) for k in options)
        ):
            raise ConfigError(
                f"checkpoint_storage_options={redact(options)!r}: expected a mapping of option names to "
                "values (e.g. {'endpoint_url': 'http://host:9000'}), as the checkpoint "
                "directory's fsspec filesystem takes them."
            )


@dataclass(frozen=True)
class FailureConfig:
    """What a failure costs: restarts, elastic shrinking, and how long to wait before calling a worker lost.

    Attributes:
        max_restarts: a failed stage restarts from the latest checkpoint this many times before the job fails (0: never).
        min_workers: after a failure that took task slots away, continue on fewer workers, down to this many (default: always the full count); back to the full count at a later restart when the slots return.
        start_timeout_s: how long the workers may take to start together.
        pg_timeout_s: how long one collective operation may block before the workers fail the stage (the hang detector; torch's own default would be 30 minutes).
        fault_tolerance: what a lost worker costs a synchronous job: "restart" restarts every worker from the latest checkpoint; "step" drops the lost worker at the next step boundary, the others continue without restarting and a replacement heals from a live peer (strategies allreduce, diloco and hsdp, whose replica groups of shard_size workers leave and rejoin whole; in-memory, Parquet or DataFrame data).
    """

    max_restarts: int = setting(3, metavar="N")
    min_workers: int | None = setting(None, metavar="N")
    start_timeout_s: float = setting(60.0, metavar="S")
    pg_timeout_s: float = setting(60.0, metavar="S")
    fault_tolerance: str = setting("restart", choices=FAULT_TOLERANCE_MODES)

    def __post_init__(self) -> None:
        if self.fault_tolerance not in FAULT_TOLERANCE_MODES:
            raise ConfigError(
                f"fault_tolerance must be one of {', '.join(FAULT_TOLERANCE_MODES)}; got {self.fault_tolerance!r}. "
                "'restart' restarts the workers from the latest checkpoint, 'step' keeps the others training."
            )
        check_int("max_restarts", self.max_restarts, 0)
        check_int("min_workers", self.min_workers, optional=True)
        check_seconds("start_timeout_s", self.start_timeout_s)
        check_seconds("pg_timeout_s", self.pg_timeout_s)


@dataclass(frozen=True)
class MonitorConfig:
    """What the job shows and records while it runs.

    Attributes:
        show_progress: live progress on the terminal (epoch, step, ETA, loss, throughput, the time split per worker, straggler warnings).
        run_dir: a directory for the run log run.jsonl (the configuration, every worker's metrics, epochs, warnings; what sparkdp report draws) and, from sparkdp train, the trained model.
        tensorboard: also write TensorBoard event files to run_dir/tensorboard.
        mlflow: an MLflow tracking URI to log the run to (e.g. sqlite:///runs/mlflow.db or http://host:5000).
        mlflow_run_id: log into this existing MLflow run at the mlflow URI instead of a new one; whoever created the run ends it (a search's trial runs are made this way).
        metrics_interval_s: seconds between two metrics reports of a worker.
    """

    show_progress: bool = setting(True, negative=("-q", "--quiet"))
    run_dir: str | None = setting(None, aliases=("--out",), metavar="DIR")
    tensorboard: bool = setting(False)
    mlflow: str | None = setting(None, metavar="URI")
    mlflow_run_id: str | None = setting(None, metavar="ID")
    metrics_interval_s: float = setting(2.0, aliases=("--metrics-interval",), metavar="S")

    def __post_init__(self) -> None:
        _flags(self, "show_progress", "tensorboard")
        _paths(self, "run_dir", "mlflow")
        check_seconds("metrics_interval_s", self.metrics_interval_s)
        if self.mlflow_run_id is not None and not isinstance(self.mlflow_run_id, str):
            raise ConfigError(
                f"mlflow_run_id must be an MLflow run's id (a string); got {self.mlflow_run_id!r}."
            )
        if self.mlflow_run_id is not None and not self.mlflow:
            raise ConfigError(
                "mlflow_run_id needs mlflow, the tracking URI its run is in: give both, or neither."
            )
        if self.tensorboard and self.run_dir is None:
            raise ConfigError(
                "tensorboard=True needs run_dir (the directory its event files go to); "
                "on the command line, --tensorboard needs --run-dir DIR."
            )


def _comma_list(text: str) -> Any:
    items = [c.strip() for c in text.split(",") if c.strip()]
    return items[0] if len(items) == 1 else items


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(
            f"feature_shape expects comma-separated integers such as 1,28,28; got {text!r}."
        ) from None


@dataclass(frozen=True)
class Columns:
    """Which columns of a Spark DataFrame or Parquet data are the features and the label.

    Attributes:
        features: the feature column, or several (concatenated per row; comma-separated on the command line).
        label: the label column.
        feature_shape: each row's features reshaped to this, e.g. (1, 28, 28) (1,28,28 on the command line).
        drop_nulls: drop rows with nulls instead of failing.
        shuffle_buffer: rows each worker's shuffle buffer holds.
        dict_batches: give each feature column its own tensor, in a dict keyed by column name (e.g. input_ids, attention_mask, labels for model(**batch)), instead of concatenating them; integer columns and arrays stay int64.
    """

    features: Any = setting(None, metavar="COLS", parse=_comma_list)
    label: str | None = setting(None, metavar="COL")
    feature_shape: Any = setting(None, metavar="DIMS", parse=_shape)
    drop_nulls: bool = setting(False)
    shuffle_buffer: int = setting(10_000, metavar="ROWS")
    dict_batches: bool = setting(False)

    def __post_init__(self) -> None:
        if self.features is None and self.label is not None:
            raise ConfigError("label= was given without features=; name the feature column(s) too.")
        check_int("shuffle_buffer", self.shuffle_buffer)
        _flags(self, "drop_nulls", "dict_batches")
        if self.dict_batches and self.feature_shape is not None:
            raise ConfigError(
                "feature_shape reshapes one concatenated feature tensor; with dict_batches=True each "
                "column keeps its own shape. Drop one of the two."
            )

    @property
    def given(self) -> bool:
        return self.features is not None

    def as_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class JobConfig:
    """A whole job's settings (the data, model, loss and optimizer aside), one group per concern.

    Build one from flat settings with :meth:`JobConfig.of` (``JobConfig.of(epochs=2,
    workers=4)``), which is what ``sparkdp.fit``'s keywords do.
    """

    training: TrainingConfig = field(default_factory=TrainingConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    failures: FailureConfig = field(default_factory=FailureConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    columns: Columns = field(default_factory=Columns)

    def __post_init__(self) -> None:
        for group in dataclasses.fields(self):
            if not isinstance(getattr(self, group.name), GROUPS[group.name]):
                raise ConfigError(
                    f"{group.name} must be a {GROUPS[group.name].__name__}; got "
                    f"{type(getattr(self, group.name)).__name__}."
                )
        every, accumulate = self.checkpoints.checkpoint_every, self.training.accumulate
        if every is not None and every % accumulate:
            raise ConfigError(
                f"checkpoint_every ({every}) counts batches and must be a multiple of accumulate "
                f"({accumulate}): checkpoints fall between optimizer steps. Use e.g. "
                f"checkpoint_every={every - every % accumulate or accumulate}."
            )
        low, high = self.failures.min_workers, self.scaling.workers
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"min_workers ({low}) cannot exceed workers ({high}); "
                "min_workers is how far an elastic restart may shrink the job."
            )

    @classmethod
    def of(
        cls,
        settings: Mapping[str, Any] | None = None,
        /,
        *,
        allowed: Collection[str] | None = None,
        caller: str = "the job",
        **more: Any,
    ) -> JobConfig:
        """A config from flat settings (``epochs=2``) or whole groups (``scaling=ScalingConfig(...)``).

        ``allowed`` limits which settings the caller takes; anything else is a ``ConfigError``
        naming the allowed ones and the closest match."""
        values = {**(settings or {}), **more}
        owner = {name: group for group, cls in GROUPS.items() for name in setting_names(cls)}
        known = list(owner)
        permitted = list(known if allowed is None else allowed) + list(GROUPS)
        groups: dict[str, Any] = {}
        flat: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
        for key, value in values.items():
            if key not in permitted:
                close = difflib.get_close_matches(str(key), permitted, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                what = "setting" if key in known or key not in GROUPS else "group"
                raise ConfigError(
                    f"{caller} has no {what} {key!r}; allowed: {', '.join(sorted(permitted))}.{hint}"
                )
            if key in GROUPS:
                groups[key] = value
            else:
                flat[owner[key]][key] = value
        for name, group in GROUPS.items():
            base = groups.setdefault(name, group())
            if flat[name] and isinstance(base, group):  # (else JobConfig's check names the wrong type)
                groups[name] = dataclasses.replace(cast(Any, base), **flat[name])
        return cls(**groups)

    def settings(self) -> dict[str, Any]:
        """Every setting by its flat name (for run logs, summaries and job files)."""
        return {
            name: getattr(getattr(self, group), name)
            for group, cls in GROUPS.items()
            for name in setting_names(cls)
        }


@dataclass(frozen=True)
class GenerationConfig:
    """How ``sparkdp.generate`` decodes a column of prompts (not a training setting).

    Attributes:
        max_new_tokens: tokens generated after each prompt at most (fewer when the model emits its end-of-text token).
        do_sample: sample each next token from the model's distribution; False: greedy (the most likely token).
        temperature: divide the logits by this before sampling (do_sample); below 1 sharpens, above 1 flattens.
        top_k: sample among the k most likely tokens only (do_sample); unset: all tokens.
        top_p: sample among the most likely tokens whose probabilities add up to top_p (nucleus sampling, do_sample); 1.0: all tokens.
        seed: the seed of sampling; each row draws from its own generator seeded by seed and the row's key, so a row's text does not depend on partitions or batches.
        batch_size: prompts per generate call on an executor (left-padded to the longest of them).
    """

    max_new_tokens: int = setting(32)
    do_sample: bool = setting(False)
    temperature: float = setting(1.0)
    top_k: int | None = setting(None)
    top_p: float = setting(1.0)
    seed: int = setting(0)
    batch_size: int = setting(16)

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens)
        check_int("batch_size", self.batch_size)
        check_int("top_k", self.top_k, optional=True)
        check_int("seed", self.seed, low=0)
        _flags(self, "do_sample")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ConfigError(f"temperature must be a number > 0; got {self.temperature!r}.")
        if not self.temperature > 0:
            raise ConfigError(f"temperature must be > 0 (lower is greedier); got {self.temperature!r}.")
        top_p = self.top_p
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise ConfigError(f"top_p must be a number in (0, 1] (1.0 keeps every token); got {top_p!r}.")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters around a Hugging Face model trained from the command line (--hf-model): only the adapters train, and the checkpoints and the export hold only them.

    Attributes:
        lora_r: the rank of the LoRA adapters wrapped around --hf-model's layers (peft's LoraConfig r); unset: no adapters, every parameter trains.
        lora_alpha: the adapters' scale numerator: each update is scaled by lora_alpha / lora_r; unset: lora_r (a scale of 1).
        lora_dropout: dropout on the adapters' input while training (0 to below 1).
        lora_target_modules: the names of the layers to adapt, comma-separated (e.g. c_attn,c_fc for GPT-2); unset: peft's choice for the model's architecture.
    """

    lora_r: int | None = setting(None, metavar="R")
    lora_alpha: int | None = setting(None, metavar="ALPHA")
    lora_dropout: float = setting(0.0, metavar="P")
    lora_target_modules: Any = setting(None, metavar="NAMES", parse=_comma_list)

    def __post_init__(self) -> None:
        check_int("lora_r", self.lora_r, optional=True)
        check_int("lora_alpha", self.lora_alpha, optional=True)
        dropout = self.lora_dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ConfigError(f"lora_dropout must be a probability in [0, 1); got {dropout!r}.")
        targets = (
            [self.lora_target_modules]
            if isinstance(self.lora_target_modules, str)
            else self.lora_target_modules
        )
        if targets is not None and (
            not isinstance(targets, (list, tuple))
            or not targets
            or not all(isinstance(t, str) and t.strip() for t in targets)
        ):
            raise ConfigError(
                f"lora_target_modules must be layer names, e.g. c_attn,c_fc (a list in a job file); got {targets!r}."
            )
        if self.lora_r is None and (self.lora_alpha is not None or dropout or targets is not None):
            raise ConfigError(
                "lora_alpha, lora_dropout and lora_target_modules shape LoRA adapters; give their rank "
                "with lora_r (e.g. --lora-r 8) too, or leave them out for a full fine-tune."
            )

    @property
    def enabled(self) -> bool:
        return self.lora_r is not None

    @property
    def target_modules(self) -> list[str] | None:
        """The layer names as a list (one name on the command line arrives as a string)."""
        targets = self.lora_target_modules
        return None if targets is None else [targets] if isinstance(targets, str) else list(targets)


def setting_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def group_of(name: str) -> str:
    """The JobConfig group a flat setting belongs to."""
    return next(group for group, cls in GROUPS.items() if name in setting_names(cls))


#: JobConfig's groups by attribute name
GROUPS: dict[str, type] = {
    "training": TrainingConfig,
    "scaling": ScalingConfig,
    "checkpoints": CheckpointConfig,
    "failures": FailureConfig,
    "monitor": MonitorConfig,
    "columns": Columns,
}

JOB_DEFAULTS = JobConfig()

#: the settings ``sparkdp.run`` and ``sparkdp.launch`` take: the user's own loop sets the rest
RUN_SETTINGS = (
    "strategy",
    "strategy_options",
    "seed",
    "workers",
    "master",
    "threads",
    "checkpoint_dir",
    "max_restarts",
    "min_workers",
    "start_timeout_s",
    "pg_timeout_s",
    "show_progress",
    "run_dir",
    "metrics_interval_s",
)

__all__ = [
    "GROUPS",
    "JOB_DEFAULTS",
    "LR_SCHEDULES",
    "MEMORY_FORMATS",
    "PRECISIONS",
    "RUN_SETTINGS",
    "CheckpointConfig",
    "Columns",
    "FailureConfig",
    "GenerationConfig",
    "JobConfig",
    "LoraSettings",
    "MonitorConfig",
    "ScalingConfig",
    "TrainingConfig",
    "field_docs",
    "group_of",
    "setting",
]
