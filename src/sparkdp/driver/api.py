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

from ..config import COLUMN_DEFAULTS, Columns, JobConfig
from ..data.base import WorkerData
from ..data.datasets import Dataset as BuiltinDataset
from ..data.datasets import dataset_tensors, load_dataset
from ..data.shared import shared_with_workers
from ..data.tensors import TensorData, as_worker_data
from ..errors import ConfigError
from ..monitor.probe import open_probe
from ..strategies import resolve_strategy
from ..strategies.base import Launcher, Strategy
from ..train.checkpoint import lineage_of
from ..train.context import WorkerContext, set_current
from ..train.jobs import in_task, progress
from ..train.layout import preflight_layout
from ..train.loop import FitSpec, check_batch, check_labels, class_scores, fit_worker
from ..train.optim import optimizer_factory, resolve_loss
from ..train.report import WorkerReport
from ..train.result import TrainResult
from ..train.serialize import state_from_bytes
from .monitoring import monitored
from .recovery import (
    checkpoint_policy,
    merged_history,
    refuse_foreign_checkpoints,
    resume_point,
    resumed,
    run_with_restarts,
)

log = logging.getLogger(__name__)


def _resolve_data(data: Any, labels: Any, eval_data: Any) -> tuple[WorkerData, WorkerData | None]:
    if isinstance(data, str):
        ds = load_dataset(data)
        data = ds
    if isinstance(data, BuiltinDataset):
        train, test = dataset_tensors(data)
        return train, (test if eval_data is None else as_worker_data(eval_data))
    if data is None:
        raise ConfigError("no training data given: pass arrays, a torch Dataset or a dataset name such as "
                          "'fashion-mnist'.")
    train = as_worker_data(data, labels)
    return train, (as_worker_data(eval_data) if eval_data is not None else None)


def _columnar(data: Any, columns: Columns, what: str) -> Any:
    """A Spark DataFrame or a Parquet path with ``features=``/``label=`` as streamed training data."""
    import os

    from ..data.parquet import ParquetData

    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pyspark.sql"):
        from ..spark.dataframe import dataframe_data

        return dataframe_data(data, **columns.as_kwargs())
    if isinstance(data, (str, os.PathLike)) or (isinstance(data, (list, tuple)) and data
                                                and all(isinstance(p, (str, os.PathLike)) for p in data)):
        return ParquetData(data, **columns.as_kwargs())
    if isinstance(data, WorkerData):
        return data
    raise ConfigError(f"features=/label= name columns, so {what} must be a Spark DataFrame or a Parquet path "
                      f"(file, directory or list of files); got {type(data).__name__}. For arrays, pass "
                      "(features, labels) without features=.")


def _preflight(model: nn.Module, loss_fn: Callable, data: WorkerData, memory_format: str) -> str:
    """Check on the driver, in milliseconds, what would otherwise fail inside every Spark task: the
    column conversion, the model's input shape, the loss and the label range. Columns' mapping to
    tensors is logged before any Spark job.

    Returns the memory format the workers train in (see ``train.layout``)."""
    columnar = hasattr(data, "converter") and hasattr(data, "sample")
    columns = cast(Any, data)  # when columnar: ParquetData or a streamed DataFrameSource (duck-typed)
    if columnar:
        x, y = columns.converter.preview(columns.sample())
    elif isinstance(data, TensorData):
        x, y = next(data.eval_batches(rank=0, world_size=1, batch_size=2))
    else:  # nothing to probe the layout with: "auto" stays on the safe side
        return "contiguous" if memory_format == "auto" else memory_format
    out = _forward(model, loss_fn, x, y)
    if columnar:
        if class_scores(out, y) and y.dim() == 1:
            columns.converter.num_classes = out.shape[1]  # every batch's labels are then checked against it
        log.info("data columns -> tensors: %s", columns.converter.describe())
    else:
        assert isinstance(data, TensorData)  # any other data returned above
        check_labels(out, data.labels)  # every label, not only the sample's
    return preflight_layout(memory_format, model, lambda to_batch: _forward(model, loss_fn, to_batch(x), y))


def _forward(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> Any:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return check_batch(model, loss_fn, x, y)
    finally:
        model.train(was_training)


def fit(model: nn.Module, data: Any = None, *, labels: Any = None, eval_data: Any = None,
        loss: Any = "cross_entropy", optimizer: Any = "sgd", optimizer_options: dict | None = None,
        strategy: str | Strategy = "allreduce", strategy_options: dict | None = None,
        workers: int | None = None, epochs: int = 1, batch_size: int = 64, seed: int = 0,
        shuffle: bool = True, lr_scheduler: Callable[[Any], Any] | None = None, master: str | None = None,
        spark: Any = None, threads: int | None = None,
        start_timeout_s: float = 60.0, pg_timeout_s: float = 60.0, show_progress: bool = True,
        features: Any = None, label: str | None = None, feature_shape: Any = None, drop_nulls: bool = False,
        shuffle_buffer: int = 10_000, eval_every: int = 1, memory_format: str = "auto",
        checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
        checkpoint_every_s: float | None = None, keep_checkpoints: int = 3, resume: str | None = None,
        max_restarts: int = 3, min_workers: int | None = None, run_dir: str | None = None,
        tensorboard: bool = False, mlflow: str | None = None, metrics_interval_s: float = 2.0) -> TrainResult:
    """Train ``model`` data-parallel on Spark and return it trained.

    Args:
        model: any ``torch.nn.Module``; it is updated in place with the trained weights.
        data: ``(features, labels)`` arrays/tensors, features with ``labels=``, a
            map-style torch Dataset, or a built-in dataset name (``"fashion-mnist"``,
            whose test split then becomes ``eval_data``).
        eval_data: optional held-out data, evaluated after every ``eval_every``-th epoch
            and always after the last one (so ``eval_every=epochs`` evaluates once, at the end).
        labels: the labels, when ``data`` is the features alone.
        features: with a Spark DataFrame or a Parquet path (file, directory or list) as
            ``data``: the feature column(s). Rows are streamed to the workers as Arrow
            record batches (see ``sparkdp.data.arrow`` for the column types).
        label: with a DataFrame or Parquet path: the label column.
        feature_shape: the shape each row's features are reshaped to (e.g. ``(1, 28, 28)``).
        drop_nulls: drop rows with nulls instead of raising ``DataError``.
        shuffle_buffer: the rows each worker's shuffle buffer holds (DataFrame / Parquet).
        shuffle: shuffle the training data every epoch (seeded by ``seed``).
        seed: the seed of the shuffles and of every worker's random streams.
        loss: a name (``"cross_entropy"``, ``"mse"``, ...) or ``(outputs, labels) -> loss``.
        optimizer: a name (default ``"sgd"`` with lr 0.01, momentum 0.9), a ``torch.optim``
            class, an instance over ``model.parameters()``, or ``params -> Optimizer``.
        optimizer_options: keyword arguments of a named or class optimizer (``{"lr": 0.05}``).
        strategy: ``"allreduce"`` (default), ``"average"``, an asynchronous rule
            (``"asgd"``, ``"hogwild"``, ...), or a Strategy object.
        strategy_options: keyword arguments of the named strategy (``{"period": 4}``).
        workers: Spark tasks to train on (default: every task slot: of a local master, or of the
            executors registered when the job starts; 2 while none has).
        epochs: passes over the training data.
        batch_size: rows per worker per step; the global batch is ``workers * batch_size``.
        lr_scheduler: ``optimizer -> scheduler`` built in every worker; stepped after every
            optimizer step (e.g. ``lambda o: torch.optim.lr_scheduler.StepLR(o, 1000)``).
        master: a Spark master URL (default: the embedded ``local[N]`` session).
        spark: an existing SparkSession to use instead.
        threads: torch threads per worker (default: ``spark.task.cpus``).
        start_timeout_s: how long the workers may take to start together.
        pg_timeout_s: how long one collective operation may block: the hang detector. A worker
            that stops making progress (stopped, deadlocked, a dead peer) leaves the others
            waiting in a collective; after this long they fail the stage, which is then
            restarted like any other failure (torch's own default would be 30 minutes).
        memory_format: ``"auto"`` (default) trains convolutional models channels-last
            (NHWC) on CPU workers, where oneDNN's kernels run them faster, if the model
            accepts it; ``"channels_last"`` forces it, ``"contiguous"`` keeps NCHW.
            The returned model is in the default layout either way (``sparkdp.train.layout``).
        checkpoint_dir: where synchronous jobs save checkpoints (``sparkdp.train.checkpoint``;
            at every epoch end at least); asynchronous ones the parameter server's state.
            Unset, a temporary directory serves automatic recovery only.
        checkpoint_every: also save every this many steps.
        checkpoint_every_s: also save when this many seconds have passed.
        keep_checkpoints: how many of the newest checkpoints to keep.
        resume: a checkpoint directory: continue from its newest valid checkpoint.
        max_restarts: a failed synchronous stage restarts from the latest checkpoint this many
            times before ``fit`` raises (0: never).
        min_workers: after a failure that took slots away, restart on fewer workers, down to
            this many (elastic; ``None``: always ``workers``); back to ``workers`` at a later
            restart when the slots return.
        show_progress: live progress on the terminal (epoch, step, ETA, loss, throughput and the
            time split per worker; straggler warnings); False: quiet.
        eval_every: evaluate after every this many epochs (and after the last).
        run_dir: a directory for the run log ``run.jsonl`` (the configuration, every worker's
            metrics, epochs, warnings; what ``sparkdp report`` draws); ``None``: no run log.
        tensorboard: also write TensorBoard event files to ``run_dir/tensorboard``.
        mlflow: an MLflow tracking URI to log the run to.
        metrics_interval_s: seconds between two reports of every worker.

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
    job = JobConfig(strategy=strategy, strategy_options=strategy_options or {}, workers=workers, epochs=epochs,
                    batch_size=batch_size, seed=seed, shuffle=shuffle, eval_every=eval_every,
                    memory_format=memory_format, master=master, threads=threads, start_timeout_s=start_timeout_s,
                    pg_timeout_s=pg_timeout_s, show_progress=show_progress, checkpoint_dir=checkpoint_dir,
                    checkpoint_every=checkpoint_every, checkpoint_every_s=checkpoint_every_s,
                    keep_checkpoints=keep_checkpoints, resume=resume, max_restarts=max_restarts,
                    min_workers=min_workers, run_dir=run_dir, tensorboard=tensorboard, mlflow=mlflow,
                    metrics_interval_s=metrics_interval_s)
    columns = Columns(features=features, label=label, feature_shape=feature_shape, drop_nulls=drop_nulls,
                      shuffle_buffer=shuffle_buffer)
    return fit_job(model, data, job, labels=labels, eval_data=eval_data, columns=columns, loss=loss,
                   optimizer=optimizer, optimizer_options=optimizer_options, lr_scheduler=lr_scheduler, spark=spark,
                   started=started)


def fit_job(model: nn.Module, data: Any, job: JobConfig, *, labels: Any = None, eval_data: Any = None,
            columns: Columns = COLUMN_DEFAULTS, loss: Any = "cross_entropy", optimizer: Any = "sgd",
            optimizer_options: dict | None = None, lr_scheduler: Callable[[Any], Any] | None = None,
            spark: Any = None, started: float | None = None) -> TrainResult:
    """:func:`fit` with the job's settings as one :class:`~sparkdp.config.JobConfig`."""
    started = time.perf_counter() if started is None else started
    strategy_obj = resolve_strategy(job.strategy, **job.strategy_options)
    loss_fn = resolve_loss(loss)
    factory = optimizer_factory(optimizer, model, **(optimizer_options or {}))
    if columns.given:
        train = _columnar(data, columns, "data")
        test = _columnar(eval_data, columns, "eval_data") if eval_data is not None else None
        if test is not None and not isinstance(test, WorkerData):
            raise ConfigError("eval_data as a DataFrame must be a plain Parquet scan (spark.read.parquet); "
                              "write it to Parquet or pass the Parquet path.")
    else:
        train, test = _resolve_data(data, labels, eval_data)
    memory_format = _preflight(model, loss_fn, train, job.memory_format)

    from ..spark.launcher import on_driver_machine
    from ..spark.session import session

    spark = spark or session(job.master)
    workers = _workers(spark, job)
    if job.min_workers is not None and job.min_workers > workers:
        raise ConfigError(f"min_workers ({job.min_workers}) cannot exceed the {workers} workers this job runs on.")
    rows = train.num_samples()
    if rows is not None and rows < workers:
        raise ConfigError(f"the training data has {rows} rows but {workers} workers were requested; every "
                          "worker needs at least one row. Use fewer workers or more data.")
    spec = FitSpec(model=model, loss=loss_fn, optimizer=factory, strategy=strategy_obj, train=train, eval=test,
                   epochs=job.epochs, batch_size=job.batch_size, seed=job.seed, shuffle=job.shuffle,
                   scheduler=lr_scheduler, eval_every=job.eval_every, memory_format=memory_format)
    # Same-machine executors map in-memory data from files instead of unpickling a copy each.
    with shared_with_workers(on_driver_machine(spark.sparkContext), train, test) as (train, test):
        return _fit_on_spark(replace(spec, train=train, eval=test), job, workers, spark, started)


def _workers(spark: Any, job: JobConfig) -> int:
    """The job's worker count (``default_workers`` unless given), with a warning when the
    workers' torch threads would outnumber their cores."""
    from ..spark.launcher import default_workers, oversubscription

    workers = job.workers or default_workers(spark.sparkContext)
    problem = oversubscription(spark.sparkContext, workers, job.threads)
    if problem:
        log.warning("sparkdp: %s", problem)
    return workers


def _fit_on_spark(spec: FitSpec, job: JobConfig, workers: int, spark: Any, started: float) -> TrainResult:
    model, train, strategy_obj = spec.model, spec.train, spec.strategy
    log.info("training %s on %d workers with %s; data: %s", type(model).__name__, workers,
             strategy_obj.name, train.describe())
    title = f"sparkdp {strategy_obj.name} x{workers}"
    details = {"model": type(model).__name__, "data": train.describe(), "strategy": strategy_obj.name,
               "strategy_options": strategy_obj.options()}
    with monitored(job, spark, workers, title, details, tls=getattr(strategy_obj, "tls", False)) as hub:
        spec = replace(spec, monitor=hub.link if hub is not None else None)
        result = _fit_monitored(spec, job, workers, spark, started, hub)
        if hub is not None:
            hub.finish(result.summary())
    return result


def _fit_monitored(spec: FitSpec, job: JobConfig, workers: int, spark: Any, started: float,
                   hub: Any) -> TrainResult:
    model, strategy_obj = spec.model, spec.strategy
    streamed = not isinstance(spec.train, WorkerData)  # a DataFrame streamed through Spark: a stage per epoch
    spinner = job.show_progress and hub is None
    if strategy_obj.launcher is Launcher.TASKS:  # a parameter server on the driver, workers as ordinary tasks
        if streamed:
            raise ConfigError(f"the asynchronous strategy {strategy_obj.name!r} reads in-memory data or Parquet "
                              "files; a DataFrame that is not a plain Parquet scan is supported by the synchronous "
                              "strategies. Write it to Parquet and pass the path.")
        from .async_job import fit_async

        refuse_foreign_checkpoints(job)
        with progress(spinner, f"sparkdp: {workers} asynchronous Spark workers ({strategy_obj.name})"):
            return fit_async(spec, job, workers=workers, spark=spark, started=started, hub=hub)
    start = resume_point(job)
    lineage = lineage_of(start) if start is not None else None  # a resumed job keeps its identity
    refuse_foreign_checkpoints(job, lineage)
    if start is not None:
        log.info("resuming from %s", start.path)
        spec = resumed(spec, start)
    with progress(spinner, f"sparkdp: training on {workers} Spark workers ({strategy_obj.name})"):
        if streamed:
            out, finished = _fit_dataframe(spec, job, workers, spark, lineage), spec
        else:
            out, finished, workers = _fit_barrier(spec, job, workers, spark, lineage)
    dropped = out.data_counters.get("dropped_null_rows", 0)
    if dropped:
        log.warning("dropped %d row(s) with null features or labels (drop_nulls=True), counted over all epochs",
                    dropped)
    model.load_state_dict(state_from_bytes(out.state))
    history, samples, train_time = merged_history(out, finished)
    return TrainResult(model=model, history=history, strategy=strategy_obj.name, workers=workers,
                       epochs=spec.epochs, wall_s=time.perf_counter() - started, train_time_s=train_time,
                       samples=samples, strategy_options=out.strategy_options,
                       details={"strategy_state": out.strategy_state,
                                # rank 0's communication figures; a synchronous strategy's are every rank's
                                "comm": dict(out.strategy_metrics)})


def _fit_dataframe(spec: FitSpec, job: JobConfig, workers: int, spark: Any, lineage: str | None) -> WorkerReport:
    """A streamed DataFrame: one stage per epoch; the driver restarts a failed epoch itself."""
    from ..spark.dataframe import DataFrameSource, fit_stream

    with checkpoint_policy(job, temporary_ok=False, job_id=lineage) as policy:  # the driver keeps every epoch's state anyway
        source = cast(DataFrameSource, spec.train)  # a streamed DataFrame's spec carries its source on the driver
        return fit_stream(spec, source, workers=workers, spark=spark, threads=job.threads,
                          pg_timeout_s=job.pg_timeout_s, start_timeout_s=job.start_timeout_s,
                          max_restarts=job.max_restarts, checkpoint=policy)


def _fit_barrier(spec: FitSpec, job: JobConfig, workers: int, spark: Any,
                 lineage: str | None) -> tuple[WorkerReport, FitSpec, int]:
    """One barrier stage (in-memory or Parquet data), resumed and restarted from checkpoints."""
    from ..spark.launcher import available_slots, on_driver_machine, run_barrier

    def run_stage(attempt: FitSpec, n: int) -> WorkerReport:
        task = in_task(lambda coll: fit_worker(attempt, coll), threads=job.threads, pg_timeout_s=job.pg_timeout_s)
        first = attempt.part.start_epoch + 1
        description = (f"sparkdp {attempt.strategy.name} on {n} workers: epochs {first}-{attempt.last_epoch() + 1}"
                       f" of {attempt.last_epoch() + 1}")
        return run_barrier(task, n, spark=spark, start_timeout_s=job.start_timeout_s, description=description)[0]

    with checkpoint_policy(job, temporary_ok=on_driver_machine(spark.sparkContext), job_id=lineage) as policy:
        return run_with_restarts(spec, job, policy, run_stage, workers,
                                 slots=lambda: available_slots(spark.sparkContext))


def run(train_fn: Callable[..., Any], *args: Any, workers: int | None = None,
        strategy: str | Strategy = "allreduce", strategy_options: dict | None = None, seed: int = 0,
        master: str | None = None, spark: Any = None, threads: int | None = None,
        start_timeout_s: float = 60.0, pg_timeout_s: float = 60.0, show_progress: bool = True,
        argv: list[str] | None = None, forward_output: bool = False) -> Any:
    """Run the user's own training function on ``workers`` Spark tasks; return rank 0's result.

    Inside ``train_fn``, :func:`~sparkdp.train.distribute.distribute` turns the single-machine model,
    optimizer and data loader into distributed ones. ``train_fn`` and its
    arguments must be picklable (define it at module level or as a closure). The workers
    see the driver's ``sys.argv`` (so a ``main()`` that parses its flags parses the same
    ones), or ``argv`` when given.

    With a synchronous strategy (``allreduce``, ``average``) the workers are one Spark barrier
    stage sharing a ``torch.distributed`` process group. With an asynchronous one (``asgd``,
    ``hogwild``, ``easgd``, ``dcasgd``, ``ddcasgd``...) they are ordinary Spark tasks (retried by
    Spark) around a parameter server on the driver whose centre starts as the first worker's model;
    every ``optimizer.step()`` then pushes and pulls as ``push_every`` / ``pull_every`` say
    (numbers of batches: your loop's epochs are not visible to sparkdp).

    Raises:
        ConfigError: bad options (e.g. ``push_every="epoch"`` here).
        WorkerFailed: ``train_fn`` raised on a worker (its rank and traceback in the message).
    """
    job = JobConfig(strategy=strategy, strategy_options=strategy_options or {}, workers=workers, seed=seed,
                    master=master, threads=threads, start_timeout_s=start_timeout_s, pg_timeout_s=pg_timeout_s,
                    show_progress=show_progress)
    strategy_obj = resolve_strategy(job.strategy, **job.strategy_options)

    from ..spark.launcher import run_barrier
    from ..spark.session import session

    spark = spark or session(job.master)
    workers = _workers(spark, job)

    worker_argv = list(sys.argv if argv is None else argv)
    name = getattr(train_fn, "__name__", "train_fn")
    # a monitoring hub only carries a launched script's output here (the loop is the user's)
    hub_job = job if forward_output else replace(job, show_progress=False)
    with monitored(hub_job, spark, workers, f"sparkdp {name} x{workers}",
                   tls=getattr(strategy_obj, "tls", False)) as hub:
        link = hub.link if hub is not None else None

        def body(collective, strategy=strategy_obj):
            probe = open_probe(link, collective.rank)
            ctx = WorkerContext(collective.rank, collective.world_size, collective, strategy, seed,
                                collective.device, probe=probe)
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
        if strategy_obj.launcher is Launcher.TASKS:  # a parameter server and ordinary, retried tasks
            from ..strategies.async_ps import AsyncParameterServer
            from .async_job import run_async

            with progress(job.show_progress, f"sparkdp: running {name} on {workers} asynchronous Spark workers"):
                return run_async(lambda _w, collective, shipped: body(collective, shipped),
                                 cast(AsyncParameterServer, strategy_obj),  # the Launcher.TASKS strategy
                                 workers=workers, spark=spark, threads=job.threads, description=description,
                                 hub=hub, start_timeout_s=job.start_timeout_s)[0]
        task = in_task(body, threads=job.threads, pg_timeout_s=job.pg_timeout_s)
        with progress(job.show_progress, f"sparkdp: running {name} on {workers} Spark workers"):
            return run_barrier(task, workers, spark=spark, start_timeout_s=job.start_timeout_s,
                               description=description)[0]


def launch(script: str | os.PathLike[str], *args: str, workers: int | None = None,
           strategy: str | Strategy = "allreduce", strategy_options: dict | None = None, seed: int = 0,
           master: str | None = None, spark: Any = None, threads: int | None = None, start_timeout_s: float = 60.0,
           pg_timeout_s: float = 60.0, show_progress: bool = True) -> None:
    """Run an unmodified training script as every worker of a job (``sparkdp launch``).

    The script runs as ``__main__`` with ``sys.argv = [script, *args]``, its directory on
    ``sys.path`` and this working directory (``sparkdp.train.script_runner``). A ``torchrun``
    style script (``init_process_group()``, DDP, ``DistributedSampler``) runs unchanged; a
    single-machine one needs the one line ``model, optimizer, loader = sparkdp.distribute(...)``,
    which also makes it train asynchronously with a parameter server under an asynchronous
    strategy (``strategy="hogwild"``...; see :func:`run`). On a cluster master the script's
    directory (the script and the modules beside it, at most 200 MB) is shipped to every
    executor with ``SparkContext.addArchive`` and that copy runs there; on ``local[N]`` the file
    itself runs.

    Raises:
        ConfigError: the script does not exist, or its directory is too large to ship.
        WorkerFailed: the script raised or exited with a non-zero status on a worker (with
            that worker's rank and the script's own traceback).
    """
    path = os.path.abspath(os.fspath(script))
    if not os.path.isfile(path):
        raise ConfigError(f"no training script at {path!r}; give the path of a .py file.")
    from ..spark.files import ship_directory, shipped_path
    from ..spark.launcher import on_driver_machine
    from ..spark.session import session
    from ..train.script_runner import run_script

    name = os.path.basename(path)
    spark = spark or session(master)
    # executors elsewhere may not see this filesystem: they run a copy of the script's directory
    shipped = None if on_driver_machine(spark.sparkContext) else \
        functools.partial(shipped_path, ship_directory(spark, os.path.dirname(path)))
    result = run(run_script, path, [str(a) for a in args], os.getcwd(), shipped, workers=workers, strategy=strategy,
                 strategy_options=strategy_options, seed=seed, master=master, spark=spark, threads=threads,
                 start_timeout_s=start_timeout_s, pg_timeout_s=pg_timeout_s, show_progress=show_progress,
                 argv=[path, *args], forward_output=True)
    if not result["distributed"]:
        log.warning("%s never called sparkdp.distribute(...) nor torch.distributed.init_process_group(): every worker "
                    "trained its own independent copy on all of its data. Add the one line model, optimizer, loader "
                    "= sparkdp.distribute(model, optimizer, loader) after they are built.", name)


__all__ = ["fit", "fit_job", "launch", "run"]
