"""The driver's entry points ``fit`` and ``run``: check the job, start Spark stages, collect.

This layer sits above both the per-worker engine (``sparkdp.train``) and the Spark stages
(``sparkdp.spark``); neither of those imports it, and ``train`` never imports ``spark``.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch
from torch import nn

from ..comm.torch_dist import set_restart_env
from ..config import RUN_SETTINGS, Columns, JobConfig
from ..data.base import WorkerData
from ..data.datasets import Dataset as BuiltinDataset
from ..data.datasets import dataset_tensors, load_dataset
from ..data.shared import shared_with_workers
from ..data.tensors import DictData, TensorData, as_worker_data
from ..errors import ConfigError
from ..models.hf import resolve_model
from ..monitor.probe import open_probe
from ..strategies import resolve_strategy
from ..strategies.async_ps import AsyncParameterServer
from ..strategies.base import Strategy
from ..train.batch import ModelLoss
from ..train.context import WorkerContext, set_current
from ..train.jobs import progress
from ..train.layout import preflight_layout
from ..train.loop import FitSpec, check_batch, check_labels, class_scores, metric_names
from ..train.optim import optimizer_factory, resolve_loss
from ..train.packing import check_packing
from ..train.result import TrainResult
from ..train.schedule import unknown_length
from ..train.tokens import check_token_batch
from .jobs import JobRun, kind_for
from .monitoring import monitored, wants_monitoring

log = logging.getLogger(__name__)


def _resolve_data(data: Any, labels: Any, eval_data: Any) -> tuple[WorkerData, WorkerData | None]:
    if isinstance(data, str):
        data = load_dataset(data)
    if isinstance(data, BuiltinDataset):
        train, test = dataset_tensors(data)
        return train, (test if eval_data is None else as_worker_data(eval_data))
    if data is None:
        raise ConfigError(
            "no training data given: pass arrays, a torch Dataset or a dataset name such as 'fashion-mnist'."
        )
    train = as_worker_data(data, labels)
    return train, (as_worker_data(eval_data) if eval_data is not None else None)


def _columnar(data: Any, columns: Columns, what: str) -> Any:
    """A Spark DataFrame or a Parquet path with ``features=``/``label=`` as streamed training data."""
    from ..data.parquet import ParquetData

    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pyspark.sql"):
        from ..spark.dataframe import dataframe_data

        return dataframe_data(data, **columns.as_kwargs())
    if isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple)) and data and all(isinstance(p, (str, os.PathLike)) for p in data)
    ):
        return ParquetData(data, **columns.as_kwargs())
    if isinstance(data, WorkerData):
        return data
    raise ConfigError(
        f"features=/label= name columns, so {what} must be a Spark DataFrame or a Parquet path "
        f"(file, directory or list of files); got {type(data).__name__}. For arrays, pass "
        "(features, labels) without features=."
    )


def _preflight(
    model: nn.Module, loss_fn: Callable, data: WorkerData, memory_format: str, metric: Callable | None = None
) -> tuple[str, tuple[str, ...]]:
    """Check on the driver, in milliseconds, what would otherwise fail inside every Spark task: the
    column conversion, the model's input shape, the loss and the label range. Columns' mapping to
    tensors is logged before any Spark job.

    Returns the memory format the workers train in (see ``train.layout``) and the names the
    ``metric`` function returns."""
    columnar = hasattr(data, "converter") and hasattr(data, "sample")
    columns = cast(Any, data)  # when columnar: ParquetData or a streamed DataFrameSource (duck-typed)
    if columnar:
        x, y = columns.converter.preview(columns.sample())
    elif isinstance(data, (TensorData, DictData)):
        x, y = next(data.eval_batches(rank=0, world_size=1, batch_size=2))
    else:  # nothing to probe the layout with: "auto" stays on the safe side
        if metric is not None:
            raise ConfigError(
                f"metric= needs a sample batch to learn its names, which {type(data).__name__} "
                "cannot give on the driver; pass arrays, a dict of arrays or Parquet data."
            )
        return ("contiguous" if memory_format == "auto" else memory_format), ()
    check_token_batch(model, data.columns if isinstance(data, DictData) else x)
    out = _forward(model, loss_fn, x, y)
    check_packing(model, x)  # packed examples must not attend to each other
    names = metric_names(metric, out, x, y) if metric is not None else ()
    if isinstance(loss_fn, ModelLoss) or not isinstance(x, torch.Tensor):  # no image batches to lay out
        if columnar:
            log.info("data columns -> tensors: %s", columns.converter.describe())
        return ("contiguous" if memory_format == "auto" else memory_format), names
    if columnar:
        if class_scores(out, y) and y.dim() == 1:
            columns.converter.num_classes = out.shape[1]  # every batch's labels are then checked against it
        log.info("data columns -> tensors: %s", columns.converter.describe())
    else:
        assert isinstance(data, TensorData)  # any other data returned above
        check_labels(out, data.labels)  # every label, not only the sample's
    return preflight_layout(
        memory_format, model, lambda to_batch: _forward(model, loss_fn, to_batch(x), y)
    ), names


def _forward(model: nn.Module, loss_fn: Callable, x: Any, y: Any) -> Any:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return check_batch(model, loss_fn, x, y)
    finally:
        model.train(was_training)


def fit(
    model: nn.Module | str,
    data: Any = None,
    *,
    labels: Any = None,
    eval_data: Any = None,
    loss: Any = "cross_entropy",
    optimizer: Any = "sgd",
    optimizer_options: dict | None = None,
    lr_scheduler: Callable[[Any], Any] | None = None,
    metric: Callable[[Any, Any], Any] | None = None,
    spark: Any = None,
    **settings: Any,
) -> TrainResult:
    """Train ``model`` data-parallel on Spark and return it trained.

    Args:
        model: any ``torch.nn.Module``; it is updated in place with the trained weights. Or
            ``"hf:DIR"``: the causal language model a local Hugging Face directory holds
            (``save_pretrained``'s ``config.json`` and safetensors weights, opened from local
            files only; :mod:`sparkdp.models.hf`), returned trained as ``result.model``.
        data: ``(features, labels)`` arrays/tensors, features with ``labels=``, a
            map-style torch Dataset, a dict of named arrays (``{"input_ids": ..., "labels": ...}``:
            dict batches, the model called as ``model(**batch)``), or a built-in dataset name
            (``"fashion-mnist"``, whose test split then becomes ``eval_data``).
        eval_data: optional held-out data, evaluated after every ``eval_every``-th epoch
            and always after the last one (so ``eval_every=epochs`` evaluates once, at the end).
        labels: the labels, when ``data`` is the features alone.
        loss: a name (``"cross_entropy"``, ``"mse"``, ...), ``(outputs, labels) -> loss``,
            ``"model"`` (the model's output carries the loss: ``.loss`` or ``["loss"]``), or
            :func:`sparkdp.model_loss` ``(fn)`` for ``fn(model, batch) -> loss``.
        optimizer: a name (default ``"sgd"`` with lr 0.01, momentum 0.9), a ``torch.optim``
            class, an instance over ``model.parameters()``, or ``params -> Optimizer``.
        optimizer_options: keyword arguments of a named or class optimizer (``{"lr": 0.05}``).
        lr_scheduler: ``optimizer -> scheduler`` built in every worker; stepped after every
            optimizer step (e.g. ``lambda o: torch.optim.lr_scheduler.StepLR(o, 1000)``); for a
            named one see ``lr_schedule``.
        metric: ``(outputs, batch) -> {name: value}`` evaluated with the test metrics: a value is
            the batch's mean (weighted by its rows), or a ``(sum, count)`` pair; each name is
            reported as ``test_<name>``, the sums over all batches of all workers divided by the
            counts. ``batch`` is the dict of a dict batch, else ``(features, labels)``.
        spark: an existing SparkSession to use instead of ``master``'s.
        **settings: any job setting by name, or a whole group (``scaling=ScalingConfig(...)``),
            as :meth:`~sparkdp.config.JobConfig.of` maps them; each is documented on its group:
            :class:`~sparkdp.config.TrainingConfig` (``strategy``, ``strategy_options``,
            ``epochs``, ``batch_size``, ``seed``, ``shuffle``, ``eval_every``, ``memory_format``,
            ``precision``, ``accumulate``, ``clip_grad_norm``, ``lr_schedule``, ``warmup_steps``,
            ``min_lr_ratio``),
            :class:`~sparkdp.config.ScalingConfig` (``workers``, ``master``, ``threads``),
            :class:`~sparkdp.config.CheckpointConfig` (``checkpoint_dir``, ``checkpoint_every``,
            ``checkpoint_every_s``, ``keep_checkpoints``, ``resume``),
            :class:`~sparkdp.config.FailureConfig` (``max_restarts``, ``min_workers``,
            ``start_timeout_s``, ``pg_timeout_s``), :class:`~sparkdp.config.MonitorConfig`
            (``show_progress``, ``run_dir``, ``tensorboard``, ``mlflow``, ``mlflow_run_id``,
            ``metrics_interval_s``)
            and, with a Spark DataFrame or a Parquet path as ``data``, :class:`~sparkdp.config.Columns`
            (``features``, ``label``, ``feature_shape``, ``drop_nulls``, ``shuffle_buffer``,
            ``dict_batches``: rows
            are then streamed to the workers as Arrow record batches, see ``sparkdp.data.arrow``).

    Returns:
        A :class:`~sparkdp.TrainResult`: the trained model, the per-epoch history, timings.

    Raises:
        ConfigError: a bad argument (said before any Spark work).
        DataError: data that cannot be read or converted.
        WorkerFailed: a worker failed more often than ``max_restarts`` allows.
        TrainingDiverged: the loss became NaN or infinite.

    Examples:
        >>> import torch, sparkdp
        >>> x, y = torch.randn(256, 4), torch.randint(0, 2, (256,))
        >>> model = torch.nn.Linear(4, 2)
        >>> result = sparkdp.fit(model, (x, y), epochs=2, workers=2, show_progress=False)
        >>> [h["epoch"] for h in result.history], result.workers
        ([1, 2], 2)
    """
    started = time.perf_counter()
    job = JobConfig.of(settings, caller="fit")
    return fit_job(
        model,
        data,
        job,
        labels=labels,
        eval_data=eval_data,
        loss=loss,
        optimizer=optimizer,
        optimizer_options=optimizer_options,
        lr_scheduler=lr_scheduler,
        metric=metric,
        spark=spark,
        started=started,
    )


def fit_job(
    model: nn.Module | str,
    data: Any,
    job: JobConfig,
    *,
    labels: Any = None,
    eval_data: Any = None,
    loss: Any = "cross_entropy",
    optimizer: Any = "sgd",
    optimizer_options: dict | None = None,
    lr_scheduler: Callable[[Any], Any] | None = None,
    metric: Callable[[Any, Any], Any] | None = None,
    spark: Any = None,
    started: float | None = None,
    on_epoch: Callable[[dict[str, Any]], bool | None] | None = None,
    reserved_slots: int | None = None,
) -> TrainResult:
    """:func:`fit` with the job's settings as one :class:`~sparkdp.config.JobConfig`.

    ``on_epoch(record)`` is called on the driver with each epoch's results (``history``'s record,
    as rank 0 sends it while the job runs); when it returns True the workers stop after that
    epoch and the job returns the epochs run so far (the answer to rank 0's epoch record on the
    monitoring connection, ``sparkdp.monitor.hub``; a search prunes trials this way). ``reserved_slots``: task slots the caller keeps free for this job
    alone (a search's slot pool), so its workers' ``threads`` may use their cores."""
    started = time.perf_counter() if started is None else started
    model = resolve_model(model)
    strategy_obj = resolve_strategy(job.training.strategy, **job.training.strategy_options)
    loss_fn = resolve_loss(loss)
    columns = _dict_batches_for_model_loss(job.columns, loss_fn)
    job = replace(job, columns=columns)
    training = job.training
    if training.lr_schedule != "constant" and lr_scheduler is not None:
        raise ConfigError(
            f"both lr_schedule={training.lr_schedule!r} and lr_scheduler= were given; pass one "
            "(lr_schedule names a built-in schedule, lr_scheduler builds any other)."
        )
    if metric is not None and not callable(metric):
        raise ConfigError(
            f"metric must be a function (outputs, batch) -> {{name: value}}; got {type(metric).__name__}."
        )
    factory = optimizer_factory(optimizer, model, **(optimizer_options or {}))
    if columns.given:
        train = _columnar(data, columns, "data")
        test = _columnar(eval_data, columns, "eval_data") if eval_data is not None else None
        if test is not None and not isinstance(test, WorkerData):
            raise ConfigError(
                "eval_data as a DataFrame must be a plain Parquet scan (spark.read.parquet); "
                "write it to Parquet or pass the Parquet path."
            )
    else:
        train, test = _resolve_data(data, labels, eval_data)
    memory_format, names = _preflight(model, loss_fn, train, job.training.memory_format, metric)
    if training.lr_schedule != "constant" and train.num_samples() is None:
        raise unknown_length(training.lr_schedule)

    from ..spark.cluster import on_driver_machine
    from ..spark.session import session

    spark = spark or session(job.scaling.master)
    workers = _workers(spark, job, reserved_slots)
    if job.failures.min_workers is not None and job.failures.min_workers > workers:
        raise ConfigError(
            f"min_workers ({job.failures.min_workers}) cannot exceed the {workers} workers this job runs on."
        )
    rows = train.num_samples()
    if rows is not None and rows < workers:
        raise ConfigError(
            f"the training data has {rows} rows but {workers} workers were requested; every "
            "worker needs at least one row. Use fewer workers or more data."
        )
    spec = FitSpec(
        model=model,
        loss=loss_fn,
        optimizer=factory,
        strategy=strategy_obj,
        train=train,
        eval=test,
        training=replace(training, memory_format=memory_format),
        scheduler=lr_scheduler,
        metric=metric,
        metric_names=names,
    )
    # Same-machine executors map in-memory data from files instead of unpickling a copy each.
    with shared_with_workers(on_driver_machine(spark), train, test) as (train, test):
        spec = replace(spec, train=train, eval=test)
        spec = replace(spec, stoppable=on_epoch is not None)
        return _fit_on_spark(spec, job, workers, spark, started, on_epoch)


def _dict_batches_for_model_loss(columns: Columns, loss_fn: Callable) -> Columns:
    """Columns with ``dict_batches`` on when the model computes its own loss from the columns and
    no label column is named: such a model takes the columns as keyword arguments (``input_ids``,
    ``labels``...), never as one concatenated float vector without labels."""
    if not columns.given or not isinstance(loss_fn, ModelLoss) or columns.label or columns.dict_batches:
        return columns
    if columns.feature_shape is not None:
        raise ConfigError(
            "loss='model' with features= and no label= gives the model its columns by name "
            "(dict_batches=True), which feature_shape cannot reshape; drop feature_shape, or name "
            "the label column with label=."
        )
    log.info(
        "sparkdp: loss='model' without a label column: each feature column is a keyword argument "
        "of the model (dict_batches=True)"
    )
    return replace(columns, dict_batches=True)


def _workers(spark: Any, job: JobConfig, reserved_slots: int | None = None) -> int:
    """The job's worker count (``default_workers`` unless given), with a warning when the
    workers' torch threads would outnumber their cores."""
    from ..spark.cluster import default_workers, oversubscription

    workers = job.scaling.workers or default_workers(spark)
    problem = oversubscription(spark, workers, job.scaling.threads, reserved_slots)
    if problem:
        log.warning("sparkdp: %s", problem)
    return workers


def _fit_on_spark(
    spec: FitSpec,
    job: JobConfig,
    workers: int,
    spark: Any,
    started: float,
    on_epoch: Callable[[dict[str, Any]], bool | None] | None = None,
) -> TrainResult:
    model, train, strategy_obj = spec.model, spec.train, spec.strategy
    log.info(
        "training %s on %d workers with %s; data: %s",
        type(model).__name__,
        workers,
        strategy_obj.name,
        train.describe(),
    )
    title = f"sparkdp {strategy_obj.name} x{workers}"
    details = {
        "model": type(model).__name__,
        "data": train.describe(),
        "strategy": strategy_obj.name,
        "strategy_options": strategy_obj.options(),
    }
    unreachable = _unreachable(job, spark, strategy_obj, hub_wanted=on_epoch is not None)
    if unreachable and isinstance(strategy_obj, AsyncParameterServer) and not strategy_obj.servers:
        log.warning(
            "sparkdp: the parameter server runs as a Spark task on the executors (servers=1) instead of "
            "in this process: %s",
            unreachable,
        )
    # a DataFrame streamed through Spark: a stage per epoch
    kind = kind_for(
        spec.strategy, not isinstance(spec.train, WorkerData), bool(unreachable), job.failures.fault_tolerance
    )
    with monitored(
        job,
        spark,
        workers,
        title,
        details,
        strategy=strategy_obj,
        unreachable=unreachable,
        on_epoch=on_epoch,
    ) as hub:
        spec = replace(spec, monitor=hub.link if hub is not None else None)
        with progress(
            job.monitor.show_progress and hub is None,  # a spinner where no live display runs
            f"sparkdp: training on {workers} {kind.label} ({spec.strategy.name})",
        ):
            result = kind.fit(spec, JobRun(job, workers, spark, hub, started))
        if hub is not None:
            hub.finish(result.summary())
    return result


def _unreachable(
    job: JobConfig, spark: Any, strategy: Strategy | None, hub_wanted: bool = False
) -> str | None:
    """Why executors cannot connect to this process, when something of the job would listen in it
    (the monitoring hub, a parameter server on the driver) and they may run elsewhere (a cluster,
    a Spark Connect server on another machine); None otherwise."""
    from ..spark.launcher import unreachable_reason

    listens = (
        hub_wanted
        or wants_monitoring(job)
        or (isinstance(strategy, AsyncParameterServer) and not strategy.servers)
    )
    return unreachable_reason(spark, start_timeout_s=job.failures.start_timeout_s) if listens else None


def run(
    train_fn: Callable[..., Any],
    *args: Any,
    spark: Any = None,
    argv: list[str] | None = None,
    forward_output: bool = False,
    details: dict[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """Run the user's own training function on ``workers`` Spark tasks; return rank 0's result.

    Inside ``train_fn``, :func:`~sparkdp.train.distribute.distribute` turns the single-machine model,
    optimizer and data loader into distributed ones. ``train_fn`` and its
    arguments must be picklable (define it at module level or as a closure). The workers
    see the driver's ``sys.argv`` (so a ``main()`` that parses its flags parses the same
    ones), or ``argv`` when given. ``details`` are added to the run log's header (:func:`launch`
    records there the files it shipped).

    With a synchronous strategy (``allreduce``, ``average``) the workers are one Spark barrier
    stage sharing a ``torch.distributed`` process group. With an asynchronous one (``asgd``,
    ``hogwild``, ``easgd``, ``dcasgd``, ``ddcasgd``...) they are ordinary Spark tasks (restarted
    as ``max_restarts`` allows) around a parameter server on the driver whose centre starts as the first worker's model;
    every ``optimizer.step()`` then pushes and pulls as ``push_every`` / ``pull_every`` say
    (numbers of batches: your loop's epochs are not visible to sparkdp).

    ``settings`` are the job settings a loop of the user's own can use (``strategy``,
    ``strategy_options``, ``seed``, ``workers``, ``master``, ``threads``, ``checkpoint_dir``,
    ``max_restarts``, ``min_workers``, ``start_timeout_s``, ``pg_timeout_s``, ``show_progress``,
    ``run_dir``: a run log of the settings and the workers' records, ``metrics_interval_s``; see
    :func:`fit`); ``spark`` an existing session. A failed attempt runs ``train_fn`` again on
    every worker, as ``max_restarts`` allows (docs/guide/reliability.md): as under torchrun, the
    n-th restart sees ``TORCHELASTIC_RESTART_COUNT=n`` and, with ``checkpoint_dir``,
    ``SPARKDP_CHECKPOINT_DIR``, where ``train_fn`` saves and finds what it resumes from.

    The result travels to the driver as data, never as a pickle: ``None``, numbers, strings,
    bytes, tensors, numpy arrays, and lists, tuples and dicts of them (a ``state_dict`` is one;
    :mod:`sparkdp.spark.results`).

    Raises:
        ConfigError: bad options (e.g. ``push_every="epoch"`` here), or ``train_fn`` returned
            something that is not data (a model object: return its ``state_dict()``).
        WorkerFailed: ``train_fn`` failed on a worker more often than ``max_restarts`` allows (its
            rank and traceback in the message).
    """
    return _run(
        train_fn, *args, spark=spark, argv=argv, forward_output=forward_output, details=details, **settings
    )[0]


def _run(
    train_fn: Callable[..., Any],
    *args: Any,
    spark: Any = None,
    argv: list[str] | None = None,
    forward_output: bool = False,
    details: dict[str, Any] | None = None,
    **settings: Any,
) -> tuple[Any, dict[str, Any]]:
    """:func:`run`: rank 0's result, and the job's summary (what the run log's summary record
    holds: strategy, workers, wall time, the parameter server's totals)."""
    started = time.perf_counter()
    job = JobConfig.of(settings, allowed=RUN_SETTINGS, caller="run")
    strategy_obj = resolve_strategy(job.training.strategy, **job.training.strategy_options)

    from ..spark.session import session

    spark = spark or session(job.scaling.master)
    workers = _workers(spark, job)

    worker_argv = list(sys.argv if argv is None else argv)
    name = getattr(train_fn, "__name__", "train_fn")
    checkpoint_dir = None if job.checkpoints.checkpoint_dir is None else str(job.checkpoints.checkpoint_dir)
    # a monitoring hub only carries a launched script's output here (the loop is the user's)
    hub_job = job if forward_output else replace(job, monitor=replace(job.monitor, show_progress=False))
    with monitored(
        hub_job,
        spark,
        workers,
        f"sparkdp {name} x{workers}",
        details,
        strategy=strategy_obj,
        unreachable=_unreachable(hub_job, spark, None),
    ) as hub:
        link = hub.link if hub is not None else None

        def body(collective, strategy, attempt):
            probe = open_probe(link, collective.rank)
            ctx = WorkerContext(
                collective.rank,
                collective.world_size,
                collective,
                strategy,
                job.training.seed,
                collective.device,
                probe=probe,
                restart=attempt.restart,
                checkpoint_dir=checkpoint_dir,
            )
            set_restart_env(ctx.restart, job.failures.max_restarts, ctx.checkpoint_dir)
            set_current(ctx)
            saved_argv, sys.argv = sys.argv, list(worker_argv)
            try:
                result = train_fn(*args)
                ctx.finish()
                return result
            finally:
                sys.argv = saved_argv
                set_current(None)
                probe.close()

        description = f"sparkdp run {name} on {workers} workers"
        kind = kind_for(strategy_obj, streamed=False)
        with progress(job.monitor.show_progress, f"sparkdp: running {name} on {workers} {kind.label}"):
            result = kind.call(body, strategy_obj, JobRun(job, workers, spark, hub), description)
        summary = {
            "strategy": strategy_obj.name,
            "strategy_options": strategy_obj.options(),
            "workers": workers,
            "wall_s": time.perf_counter() - started,
            "server": hub.server_totals() if hub is not None else None,
        }
        if hub is not None:
            hub.finish(summary)
        return result, summary


def launch(script: str | os.PathLike[str], *args: str, spark: Any = None, **settings: Any) -> dict[str, Any]:
    """Run an unmodified training script as every worker of a job (``sparkdp launch``).

    The script runs as ``__main__`` with ``sys.argv = [script, *args]``, its directory on
    ``sys.path`` and this working directory (``sparkdp.train.script_runner``). A ``torchrun``
    style script (``init_process_group()``, DDP, ``DistributedSampler``) runs unchanged; a
    single-machine one needs the one line ``model, optimizer, loader = sparkdp.distribute(...)``,
    which also makes it train asynchronously with a parameter server under an asynchronous
    strategy (``strategy="hogwild"``...; see :func:`run`). On a cluster master the script's
    directory (the script and the modules beside it, at most 200 MB) is shipped to every
    executor with ``spark.addArtifacts(..., archive=True)`` and that copy runs there; on ``local[N]`` the file
    itself runs. Hidden files and directories (``.env``, ``.aws/``), links out of the directory and
    what a ``.sparkdpignore`` there names stay behind (``sparkdp.spark.files``); the run log's
    header lists what was shipped and what was not, and one line on stderr counts them.

    ``settings`` are :func:`run`'s; with ``run_dir`` the job's run log (``run.jsonl``) is written
    there, as ``sparkdp train`` writes it.

    Returns:
        The job's summary: ``script``, ``strategy``, ``strategy_options``, ``workers``,
        ``wall_s`` and, for an asynchronous strategy whose job was monitored (live progress or
        a ``run_dir``), ``server``: the parameter server's totals (``pushes_applied``,
        ``staleness``, ``bytes_in``, ``bytes_out``...), else None.

    Raises:
        ConfigError: the script does not exist, or its directory is too large to ship.
        WorkerFailed: the script raised or exited with a non-zero status on a worker (with
            that worker's rank and the script's own traceback).
    """
    path = os.path.abspath(os.fspath(script))
    if not os.path.isfile(path):
        raise ConfigError(f"no training script at {path!r}; give the path of a .py file.")
    from ..spark.cluster import on_driver_machine
    from ..spark.files import ship_directory, shipped_path
    from ..spark.session import session
    from ..train.script_runner import run_script

    name = os.path.basename(path)
    job = JobConfig.of(settings, allowed=RUN_SETTINGS, caller="launch")
    spark = spark or session(job.scaling.master)
    # executors elsewhere may not see this filesystem: they run a copy of the script's directory
    shipped, details = None, None
    if not on_driver_machine(spark):
        shipment = ship_directory(spark, os.path.dirname(path))
        shipped = functools.partial(shipped_path, shipment.name)
        details = {"shipped_files": list(shipment.files), "not_shipped": list(shipment.skipped)}
        if job.monitor.show_progress:
            print(
                f"sparkdp: shipped {len(shipment.files)} file(s), {shipment.size / 2**20:.1f} MB, of "
                f"{os.path.dirname(path)} to the executors; left out {len(shipment.skipped)} "
                "(hidden, linked out of it, or in .sparkdpignore)",
                file=sys.stderr,
            )
    result, summary = _run(
        run_script,
        path,
        [str(a) for a in args],
        os.getcwd(),
        shipped,
        spark=spark,
        argv=[path, *args],
        forward_output=True,
        details=details,
        **settings,
    )
    started, joined = result["started"], result["joined"]
    if started and not joined:
        log.warning(
            "%s started %d process(es) on worker 0 and none joined the job: %s",
            name,
            started,
            "call sparkdp.distribute(model, optimizer, loader) in the function they run"
            if result["joinable"]
            else "in a synchronous job (allreduce, average) processes a worker starts cannot join the workers' "
            "process group, so each trained alone; use an asynchronous strategy (hogwild, asgd), whose "
            "parameter server they join, or one process per worker (e.g. --num-processes 1)",
        )
    elif started:
        log.info("%s: %d of the %d processes worker 0 started joined the job", name, joined, started)
    if not result["distributed"] and not started and result["workers"] > 1:
        log.warning(
            "%s never communicated with the other workers (no sparkdp.distribute(...), no collective on the "
            "process group, no DistributedDataParallel model over it): every worker trained its own "
            "independent copy on all of its data. Add the one line model, optimizer, loader = "
            "sparkdp.distribute(model, optimizer, loader) after they are built.",
            name,
        )
    return {"script": path, **summary}


__all__ = ["fit", "fit_job", "launch", "run"]
