"""The training loop every worker runs for ``fit`` (and that world size 1 runs locally)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import state as state_io
from ..comm.base import Collective, is_collective_timeout
from ..config import TrainingConfig
from ..data.base import WorkerData
from ..data.prefetch import DEFAULT_DEPTH, prefetch
from ..errors import ConfigError, DataError, TrainingDiverged, WorkerHung
from ..export.record import model_record
from ..frozen import store_frozen_in
from ..monitor.probe import MonitorLink, open_probe
from ..strategies.base import Strategy
from .batch import (
    ModelLoss,
    batch_rows,
    call_model,
    describe_batch,
    forward_loss,
    to_device,
    training_tokens,
)
from .checkpoint import CheckpointPolicy, checkpoint_payload, save_checkpoint
from .checkpoint_store import BackgroundWriter, HostSnapshot
from .faults import Fault
from .layout import batch_layout, set_layout, use_channels_last
from .memory import MemoryMeter
from .optim import OptimizerFactory
from .precision import resolve_precision
from .preempt import PreemptionWatch, preempted, watch_preemption
from .report import WorkerReport
from .schedule import lr_schedule
from .sharded_checkpoint import ShardedSaver, split_tensors
from .sharded_checkpoint import restore as restore_shards
from .step import Stepper, with_last
from .stop import StopNotice
from .tokens import check_token_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagePart:
    """Which part of a longer job a spec runs: jobs split into one Spark stage per epoch
    (a streamed DataFrame), and jobs resumed from a checkpoint (``train.checkpoint``).

    Attributes:
        start_epoch: the first epoch (0-based) this stage runs.
        epochs: the epochs this stage runs (None: through the job's last, ``training.epochs``;
            a streamed DataFrame's stage runs one).
        optimizer_state: the optimizer (and scheduler) state to start from
            (bytes of :func:`optimizer_state_to_bytes`).
        return_optimizer_state: put the optimizer state in the report for the next stage.
        start_step: optimizer steps of ``start_epoch`` already done (a mid-epoch resume
            skips that many batches of the epoch's permutation).
        rng: every rank's torch RNG state where the job stopped (same world size only).
        history: the job's history before this stage (checkpoints carry all of it).
        epoch_stats: for a mid-epoch resume, the epoch so far over all ranks: loss x rows,
            rows, seconds (so its history record covers the whole epoch).
        shards: a sharded checkpoint to load the model and optimizer from (see below).
    """

    start_epoch: int = 0
    epochs: int | None = None
    optimizer_state: bytes | None = None
    return_optimizer_state: bool = False
    start_step: int = 0
    rng: tuple[torch.Tensor, ...] | None = None
    history: tuple[dict[str, float], ...] = ()
    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: a sharded checkpoint to load the model and optimizer from (its manifest's URL;
    #: ``train.sharded_checkpoint``); ``optimizer_state`` then holds the optimizer's other state
    shards: str | None = None


@dataclass
class FitSpec:
    """Everything a worker needs to train; shipped to each Spark task.

    The job's settings travel as their ``config`` groups; the other fields are what no setting
    holds: the model, loss and optimizer, the resolved strategy, the data, and the job's state."""

    model: nn.Module
    loss: Callable[..., torch.Tensor]
    optimizer: OptimizerFactory
    #: ``training.strategy`` resolved (``sparkdp.strategies.resolve_strategy``): the one the workers use
    strategy: Strategy
    train: WorkerData
    eval: WorkerData | None
    #: the job's training settings; ``memory_format`` as the driver's preflight resolved it (``fit``
    #: keeps "auto" only after running the model channels-last, see ``train.layout``), and
    #: ``epochs`` the whole job's (``part`` says which of them this spec runs)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    #: rows per evaluation forward pass: 256 ran 0.49 ms/image where 1000 ran 0.77 on one CPU
    #: thread (the 2-conv CNN; 1000 images' activations no longer fit in cache)
    eval_batch_size: int = 256
    #: ``optimizer -> scheduler``; the scheduler's ``step()`` runs after every optimizer step
    #: (per-iteration schedules such as Caffe's lr policies).
    scheduler: Callable[[Any], Any] | None = None
    #: the part of a longer job this spec runs (default: the whole job in one go)
    part: StagePart = StagePart()
    #: batches a background thread prepares ahead of the trainer (0: none; see data.prefetch)
    prefetch: int = DEFAULT_DEPTH
    #: where and how often rank 0 saves checkpoints (synchronous strategies; None: never)
    checkpoint: CheckpointPolicy | None = None
    #: an injected failure (``train.faults``; tests and demonstrations only)
    fault: Fault | None = None
    #: where live metrics go (the driver's ``monitor.hub``); None: not monitored
    monitor: MonitorLink | None = None
    #: ``(outputs, batch) -> {name: value or (sum, count)}`` evaluated with the test metrics
    metric: Callable[[Any, Any], Any] | None = None
    #: the names ``metric`` returns (learned on the driver, so every rank reduces the same ones)
    metric_names: tuple[str, ...] = ()
    #: the driver's request to stop after an epoch (``train.stop``; a pruned search trial)
    stop: StopNotice | None = None

    @property
    def epochs(self) -> int:
        """The epochs this spec runs: from ``part.start_epoch`` through the job's last, or ``part.epochs``."""
        part = self.part
        return self.training.epochs - part.start_epoch if part.epochs is None else part.epochs

    def last_epoch(self) -> int:
        """The job's last epoch (0-based), also when this spec runs only part of the job."""
        return self.training.epochs - 1

    def steps_per_epoch(self, world_size: int) -> int | None:
        """Steps (batches) each worker takes per epoch, when the data's size is known (for progress and ETA)."""
        rows = self.train.num_samples()
        return None if rows is None else math.ceil(math.ceil(rows / world_size) / self.training.batch_size)

    def optimizer_steps(self, world_size: int) -> int | None:
        """The job's optimizer steps (every epoch, ``accumulate`` batches a step), when known."""
        batches, accumulate = self.steps_per_epoch(world_size), self.training.accumulate
        return None if batches is None else (self.last_epoch() + 1) * math.ceil(batches / accumulate)

    def evaluates_after(self, epoch: int) -> bool:
        """Whether test metrics are computed after ``epoch`` (0-based)."""
        every = self.training.eval_every
        return self.eval is not None and ((epoch + 1) % every == 0 or epoch == self.last_epoch())


def optimizer_state(
    optimizer: torch.optim.Optimizer, scheduler: Any = None, state: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An optimizer's (and its scheduler's) state, as :func:`optimizer_state_to_bytes` encodes it;
    ``state``: the optimizer's state as the strategy gathered it (default: its ``state_dict()``)."""
    sched = None
    if scheduler is not None and hasattr(scheduler, "state_dict"):
        sched = {k: v for k, v in scheduler.state_dict().items() if not callable(v)}
    return {"optimizer": optimizer.state_dict() if state is None else state, "scheduler": sched}


def optimizer_state_to_bytes(
    optimizer: torch.optim.Optimizer, scheduler: Any = None, state: dict[str, Any] | None = None
) -> bytes:
    """An optimizer's (and its scheduler's) state as bytes, without pickle (``sparkdp.state``)."""
    return state_io.to_bytes(optimizer_state(optimizer, scheduler, state))


def check_batch(model: nn.Module, loss_fn: Callable, x: Any, y: Any) -> Any:
    """Run one forward pass and the loss on a batch; turn torch's shape errors into ours.
    Returns the model's output."""
    if isinstance(loss_fn, ModelLoss) or not isinstance(x, torch.Tensor):
        try:
            return forward_loss(model, loss_fn, x, y)[1]
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(
                f"the model and loss cannot take a batch {describe_batch(x)}: {exc}. Check the model's "
                "arguments (a dict batch is passed as model(**batch)) against the data."
            ) from exc
    try:
        out = model(x)
    except RuntimeError as exc:
        raise ConfigError(
            f"the model cannot take a batch of features of shape {tuple(x.shape)} "
            f"({x.dtype}): {exc}. Check the model's input layer against the data."
        ) from exc
    check_labels(out, y)
    try:
        loss_fn(out, y)
    except (RuntimeError, ValueError, IndexError) as exc:
        raise ConfigError(
            f"the loss cannot compare model outputs of shape {_shapes(out)} with labels of "
            f"shape {tuple(y.shape)} ({y.dtype}): {exc}"
        ) from exc
    return out


def _shapes(out: Any) -> Any:
    return tuple(out.shape) if isinstance(out, torch.Tensor) else [tuple(o.shape) for o in out]


def class_scores(out: Any, y: torch.Tensor | None) -> bool:
    """True when ``out`` is one (rows, classes) tensor and ``y`` integer class labels: accuracy applies.
    (A model may return a tuple, e.g. a Siamese net's two features for a pair loss.)"""
    return isinstance(out, torch.Tensor) and out.dim() == 2 and y is not None and not y.is_floating_point()


def check_labels(out: torch.Tensor, y: torch.Tensor) -> None:
    if class_scores(out, y) and y.dim() == 1 and len(y):
        classes = out.shape[1]
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= classes:
            raise DataError(
                f"labels must lie in [0, {classes}) for a model with {classes} outputs, but this "
                f"batch has labels from {lo} to {hi}. Fix the labels or the model's output size."
            )


def synchronized(batches: Iterator, collective: Collective, check: bool) -> Iterator:
    """Yield batches while every rank still has one.

    Ranks with unequal data would otherwise deadlock: one waits in an all-reduce
    the others never enter. A one-element MIN all-reduce per step stops all ranks
    at the first one that runs out (the rest of the others' data is skipped, and logged).
    """
    if not check or collective.world_size == 1:
        yield from batches
        return
    for batch in batches:
        flag = torch.ones(1)
        collective.all_reduce(flag, "min")
        if flag.item() == 0:
            log.info(
                "rank %d: another worker ran out of data this epoch; skipping this rank's remaining "
                "batches so the synchronous steps stay aligned",
                collective.rank,
            )
            return
        yield batch
    collective.all_reduce(torch.zeros(1), "min")  # tell the others this rank is out


def evaluate(
    model: nn.Module,
    loss_fn: Callable,
    data: WorkerData,
    collective: Collective,
    batch_size: int,
    channels_last: bool = False,
    *,
    metric: Callable[[Any, Any], Any] | None = None,
    metric_names: tuple[str, ...] = (),
    autocast: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Loss and (for classifiers) accuracy over all ranks' shares, each row counted once.

    A model that computes its own loss over label tokens (``loss="model"``, dict batches with
    ``labels``) reports the token-mean loss and its ``exp``, the perplexity. ``metric(outputs,
    batch)`` returns ``{name: value}`` (a batch mean, weighted by the batch's rows) or
    ``{name: (sum, count)}`` per batch; each is reported as the sum over all batches of all
    ranks divided by the count."""
    model.eval()
    device = next(model.parameters(), torch.empty(0)).device  # a GPU worker's model, or the CPU
    # loss*rows, correct, rows, rows with one output tensor, loss*tokens, tokens, then per metric: sum, count
    sums = torch.zeros(6 + 2 * len(metric_names), dtype=torch.float64)
    plain = not isinstance(loss_fn, ModelLoss) and metric is None and autocast is None
    with torch.no_grad():
        for x, y in data.eval_batches(
            rank=collective.rank, world_size=collective.world_size, batch_size=batch_size
        ):
            rows = batch_rows(x)
            if plain and isinstance(x, torch.Tensor):
                x, y = x.to(device), y.to(device)
                out = model(batch_layout(x, channels_last))
                loss = loss_fn(out, y)
            else:
                x, y = to_device(x, device), to_device(y, device)
                with autocast() if autocast is not None else contextlib.nullcontext():
                    loss, out = forward_loss(
                        model,
                        loss_fn,
                        batch_layout(x, channels_last) if isinstance(x, torch.Tensor) else x,
                        y,
                    )
                tokens = loss_fn.tokens(x) if isinstance(loss_fn, ModelLoss) else None
                if tokens is not None:
                    sums[4] += float(loss) * tokens
                    sums[5] += tokens
                if metric is not None:
                    _add_metrics(sums[6:], metric(out, x if y is None else (x, y)), metric_names, rows)
            sums[0] += float(loss) * rows
            if class_scores(out, y):
                sums[1] += float((out.argmax(1) == y).sum())
            sums[2] += rows
            sums[3] += rows if isinstance(out, torch.Tensor) else 0
    collective.all_reduce(sums, "sum")
    model.train()
    rows_total = max(sums[2].item(), 1.0)
    metrics = {"test_loss": sums[0].item() / rows_total}
    if sums[3] > 0:  # not for models returning several tensors (a Siamese net's pair of features)
        metrics["test_accuracy"] = sums[1].item() / rows_total
    if sums[5] > 0:  # a language model's loss per label token, and its perplexity
        metrics["test_loss"] = sums[4].item() / sums[5].item()
        metrics["test_perplexity"] = math.exp(metrics["test_loss"])
    for i, name in enumerate(metric_names):
        total, count = sums[6 + 2 * i].item(), sums[7 + 2 * i].item()
        metrics[f"test_{name}"] = total / count if count else math.nan
    return metrics


def _add_metrics(sums: torch.Tensor, values: Any, names: tuple[str, ...], rows: int) -> None:
    """Add one batch's ``metric`` result to ``sums`` (sum, count per name)."""
    if not isinstance(values, dict) or set(values) != set(names):
        got = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise ConfigError(
            f"the metric function must return the same names for every batch, {list(names)}; got {got}."
        )
    for i, name in enumerate(names):
        value = values[name]
        total, count = value if isinstance(value, (tuple, list)) else (float(value) * rows, rows)
        sums[2 * i] += float(total)
        sums[2 * i + 1] += float(count)


def metric_names(metric: Callable[[Any, Any], Any], out: Any, x: Any, y: Any) -> tuple[str, ...]:
    """The names ``metric`` returns for one batch (run on the driver), checked."""
    values = metric(out, x if y is None else (x, y))
    if not isinstance(values, dict) or not values or not all(isinstance(k, str) for k in values):
        raise ConfigError(
            f"metric must return a dict of name -> value (a batch mean) or (sum, count); got {values!r}."
        )
    for name, value in values.items():
        pair = isinstance(value, (tuple, list))
        if (pair and len(value) != 2) or not all(
            isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1)
            for v in (value if pair else (value,))
        ):
            raise ConfigError(f"metric's {name!r} must be a number or a (sum, count) pair; got {value!r}.")
    return tuple(sorted(values))


def fit_worker(spec: FitSpec, collective: Collective) -> WorkerReport | None:
    """The one training loop every worker runs (:func:`_fit_worker`), with a hang named: when a
    collective times out, the ranks that did not time out too are the stalled ones."""
    probe = open_probe(spec.monitor, collective.rank, spec.strategy.comm_stats)
    try:
        with watch_preemption(collective, spec.checkpoint) as watch:
            return _fit_worker(spec, collective, probe, watch)
    except RuntimeError as exc:
        if collective.independent or not is_collective_timeout(exc):
            raise
        raise WorkerHung(_who_stalled(collective)) from exc
    finally:
        probe.close()


def _who_stalled(collective: Collective) -> str:
    me, stalled = collective.rank, collective.stalled_ranks()
    who = f"worker {', '.join(map(str, stalled))}" if stalled else "another worker"
    return f"{who} stopped making progress; worker {me} timed out waiting for it in a collective"


def _fit_worker(
    spec: FitSpec, collective: Collective, probe: Any, watch: PreemptionWatch | None = None
) -> WorkerReport | None:
    """The one training loop every worker runs, synchronous or asynchronous.

    What differs between strategies happens in their hooks: ``setup`` (DDP wrap, averaging
    hook, parameter-server connection), the optimizer-step hook, ``end_epoch``, ``finish``
    and ``evaluation``. In a barrier stage rank 0 returns the report; the other ranks return
    None, or a report holding only their share of the model's state where the strategy shards
    it (``Strategy.result_state``; the driver joins the shares, ``WorkerReport.joined``); an
    asynchronous worker (an independent collective) returns its own, without the model state,
    which the driver takes from the parameter server.
    """
    wall_start = time.time()
    part = spec.part
    if part.rng is not None and len(part.rng) == collective.world_size:  # resumed: the same random stream
        torch.set_rng_state(part.rng[collective.rank])
    else:  # dropout etc. differ per rank (and per resumed stage); init came from the driver
        torch.manual_seed(spec.training.seed + collective.rank + 7919 * part.start_epoch)
    strategy, training = spec.strategy, spec.training
    model = spec.model.to(collective.device)
    channels_last = use_channels_last(training.memory_format, model, collective.device)
    weights_nhwc = channels_last and strategy.channels_last_weights
    if weights_nhwc:  # before DDP lays out its buckets and the optimizer its state
        set_layout(model, True)
    precision = resolve_precision(training.precision, collective.device)
    if precision.mixed:
        strategy.adopt_precision(precision.dtype)
        store_frozen_in(model, precision.dtype)  # a frozen base in the compute dtype; adapters stay fp32
    model = strategy.shard(model, collective)  # a sharding strategy's optimizer steps the shards
    optimizer = spec.optimizer.build(model)
    scheduler = spec.scheduler(optimizer) if spec.scheduler is not None else None
    if training.lr_schedule != "constant":
        scheduler = lr_schedule(training, optimizer, spec.optimizer_steps(collective.world_size))
    if part.optimizer_state:
        saved = state_io.from_bytes(part.optimizer_state)  # what optimizer_state_to_bytes encoded
        if part.shards is not None:  # the weights and the optimizer's tensors, resharded to this world
            settings = spec.checkpoint.settings if spec.checkpoint is not None else None
            restore_shards(
                part.shards,
                strategy,
                model,
                optimizer,
                saved["optimizer"],
                settings.checkpoint_storage_options if settings is not None else None,
            )
        else:
            strategy.load_optimizer_state(optimizer, saved["optimizer"])
        if scheduler is not None and saved["scheduler"] is not None:
            scheduler.load_state_dict(saved["scheduler"])  # the schedule continues across stages
    net = strategy.setup(model, optimizer, collective)
    rank, world = collective.rank, collective.world_size
    check = not spec.train.equal_batches
    history: list[dict[str, float]] = []
    train_time = 0.0
    total_samples = 0
    policy = spec.checkpoint if not collective.independent else None
    saver = _Saver(policy, spec, strategy, optimizer, scheduler, collective) if policy is not None else None
    steps_done = 0
    memory = MemoryMeter()
    steps_per_epoch = spec.steps_per_epoch(world)
    # the plain path (float32, a step per batch, no clipping, a classic loss) does no extra work per step
    stepper = (
        None
        if (
            not precision.mixed
            and training.accumulate == 1
            and training.clip_grad_norm is None
            and not isinstance(spec.loss, ModelLoss)
        )
        else Stepper(net, spec.loss, optimizer, scheduler, strategy, precision, training)
    )
    autocast = precision.autocast if precision.mixed else None
    for epoch in range(part.start_epoch, part.start_epoch + spec.epochs):
        # (progress counts optimizer steps, as warmup_steps does: accumulate batches each)
        probe.start_epoch(
            epoch,
            None if steps_per_epoch is None else math.ceil(steps_per_epoch / training.accumulate),
            spec.last_epoch() + 1,
        )
        model.train()
        started = time.perf_counter()
        stats = torch.zeros(3, dtype=torch.float64)  # loss*rows, rows, the driver asked to stop
        skip = part.start_step if epoch == part.start_epoch else 0
        before = 0.0
        if skip and rank == 0:  # the interrupted epoch's rows so far count once, on rank 0
            stats[0], stats[1], before = part.epoch_stats
        batches = prefetch(
            itertools.islice(
                spec.train.batches(
                    rank=rank,
                    world_size=world,
                    epoch=epoch,
                    batch_size=training.batch_size,
                    seed=training.seed,
                    shuffle=training.shuffle,
                ),
                skip,
                None,
            ),
            spec.prefetch,
        )
        ready = time.perf_counter()
        stream = synchronized(batches, collective, check)
        # accumulating, a shorter last group of micro-batches must know it is the last
        marked = with_last(stream) if training.accumulate > 1 else ((b, False) for b in stream)
        for step, ((x, y), last) in enumerate(marked, start=skip):
            arrived = time.perf_counter()
            probe.batch_arrived(arrived - ready)
            if isinstance(x, torch.Tensor):
                x, y = batch_layout(x.to(collective.device), channels_last), to_device(y, collective.device)
            else:
                x, y = to_device(x, collective.device), to_device(y, collective.device)
            if epoch == 0 and step == 0:
                check_token_batch(strategy.unwrap(), x, f"worker {rank}'s first batch")
                with torch.no_grad():
                    check_batch(strategy.unwrap(), spec.loss, x, y)
            rows = batch_rows(x)
            if stepper is None:
                strategy.add_samples(rows)
                optimizer.zero_grad(set_to_none=True)
                loss = spec.loss(net(x) if isinstance(x, torch.Tensor) else call_model(net, x), y)
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            else:
                loss = stepper.micro_step(x, y, rows, step, last)
            value = loss.detach().item()
            if not math.isfinite(value):
                raise TrainingDiverged(
                    f"worker {rank}: the loss is {value} at epoch {epoch + 1}, step {step + 1}; "
                    "lower the learning rate, or check the data for NaN/inf values."
                )
            stats[0] += value * rows
            stats[1] += rows
            steps_done += 1
            if steps_done == 1:  # the optimizer's state exists from the first step on
                memory.sample(model, optimizer)
            if spec.fault is not None:  # (a "slow" fault's sleep counts as this step's compute)
                spec.fault.maybe_fire(rank, steps_done)
            probe.step_done(
                time.perf_counter() - arrived,
                rows,
                value,
                stepped=stepper is None or stepper.stepped,
                tokens=training_tokens(x) if probe.active and not isinstance(x, torch.Tensor) else None,
            )
            # (a checkpoint falls between optimizer steps, never inside a group of micro-batches)
            if watch is not None and (stepper is None or stepper.stepped) and (stop := watch.step_boundary()):
                if saver is not None:
                    saver.save(epoch, step + 1, history, stats, before + time.perf_counter() - started)
                    saver.close()
                    probe.checkpointed()
                raise preempted(stop, epoch, step + 1, saved=saver is not None)
            if saver is not None and (stepper is None or stepper.stepped) and saver.due(step + 1):
                saver.save(epoch, step + 1, history, stats, before + time.perf_counter() - started)
                probe.checkpointed()
            ready = time.perf_counter()
        memory.sample(model, optimizer)
        strategy.end_epoch()
        elapsed = before + time.perf_counter() - started
        train_time += elapsed
        stop = watch.drain() if watch is not None else None
        if (
            spec.stop is not None
            and spec.stop.shared
            and (rank == 0 or collective.independent)
            and spec.stop.posted()
        ):
            stats[2] = 1.0  # (rank 0 looks; the sum tells every rank)
        collective.all_reduce(stats, "sum")
        if stats[1].item() == 0:
            raise DataError(
                f"no training rows reached the workers in epoch {epoch + 1}: the data is empty "
                f"({spec.train.describe()}). Check filters upstream and give at least one row."
            )
        total_samples += int(stats[1])
        record = {
            "epoch": epoch + 1,
            "loss": stats[0].item() / max(stats[1].item(), 1.0),
            "samples": int(stats[1]),
            "epoch_time_s": elapsed,
        }
        target = (
            strategy.evaluation(collective, last=epoch == spec.last_epoch())
            if spec.evaluates_after(epoch)
            else None
        )
        if target is not None:
            assert spec.eval is not None  # evaluates_after(epoch) holds only with evaluation data
            record.update(
                evaluate(
                    target[0],
                    spec.loss,
                    spec.eval,
                    target[1],
                    spec.eval_batch_size,
                    channels_last,
                    metric=spec.metric,
                    metric_names=spec.metric_names,
                    autocast=autocast,
                )
            )
        history.append(record)
        log.info("rank %d epoch %d: %s", rank, epoch + 1, record)
        if rank == 0:
            probe.event("epoch", **record)
        if saver is not None:
            saver.save(epoch + 1, 0, history)
            probe.checkpointed()
        if stop is not None and epoch < spec.last_epoch():  # (after the last epoch only the report is left)
            if saver is not None:
                saver.close()
            raise preempted(stop, epoch + 1, 0, saved=saver is not None)
        if stats[2].item() > 0 and epoch < spec.last_epoch():
            log.info("rank %d: the driver asked the job to stop; stopping after epoch %d", rank, epoch + 1)
            break
    if saver is not None:
        saver.close()  # the job's last checkpoint is written before the worker reports
    strategy.finish()
    if weights_nhwc:  # what leaves the worker is in the default layout
        set_layout(model, False)
    counters = _sum_counters(spec.train, collective)
    independent = collective.independent
    memory_table = memory.gather(collective)
    # every rank's share of the model (a sharding strategy's shards; the driver joins them)
    state = b"" if independent else strategy.result_state(rank)
    opt_state = strategy.optimizer_state(optimizer) if part.return_optimizer_state else None
    if rank != 0 and not independent:
        return (
            None
            if state is None
            else WorkerReport(state=state, history=[], train_time_s=0.0, samples=0, worker=rank)
        )
    assert state is not None  # rank 0 always holds a share: the whole state, or its shards and the buffers
    return WorkerReport(
        state=state,
        history=history,
        train_time_s=train_time,
        samples=total_samples,
        strategy_options=strategy.options(),
        strategy_state=strategy.state_dict(),
        data_counters=counters,
        optimizer_state=(
            optimizer_state_to_bytes(optimizer, scheduler, opt_state) if opt_state is not None else b""
        ),
        worker=rank,
        strategy_metrics={**strategy.comm_stats(), **strategy.metrics()},
        wall_start=wall_start,
        wall_end=time.time(),
        memory=memory_table,
    )


class _Saver:
    """Rank 0 saves where every rank agrees to: every ``checkpoint_every`` steps of an epoch, when
    ``checkpoint_every_s`` passed (agreed every 8 steps by one MAX all-reduce), and at epoch ends.

    The training thread only copies the state to host memory; a background writer serializes,
    writes, commits and rotates it (one write in flight; :class:`BackgroundWriter`)."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        spec: FitSpec,
        strategy: Strategy,
        optimizer: Any,
        scheduler: Any,
        collective: Collective,
    ) -> None:
        self.policy, self.spec, self.strategy = policy, spec, strategy
        self.optimizer, self.scheduler, self.collective = optimizer, scheduler, collective
        self.last = time.monotonic()
        self.writer, self.snapshot = BackgroundWriter(), HostSnapshot()
        # a sharding strategy's ranks each write their own shards (train.sharded_checkpoint)
        self.shards = ShardedSaver(policy, collective) if strategy.saves_shards() else None
        # which model the checkpoints hold, so `sparkdp export` can rebuild it without the script
        self.model_record = model_record(spec.model) if collective.rank == 0 else None

    def due(self, step: int) -> bool:
        if self.shards is not None:
            self.shards.poll()  # commits the last sharded save once every rank wrote its part
        every_steps, every_s = self.policy.settings.checkpoint_every, self.policy.settings.checkpoint_every_s
        due = every_steps is not None and step % every_steps == 0
        if every_s is not None and step % 8 == 0:
            late = torch.tensor([float(time.monotonic() - self.last >= every_s)])
            self.collective.all_reduce(late, "max")
            due = due or late.item() > 0
        return due and self.strategy.replicas_agree()

    def save(
        self,
        epoch: int,
        step: int,
        history: list[dict[str, float]],
        stats: torch.Tensor | None = None,
        seconds: float = 0.0,
    ) -> None:
        collective = self.collective
        # every rank's RNG state and the epoch's loss/rows so far, with one SUM all-reduce
        # (RNG states are bytes, exact in float64)
        mine = torch.get_rng_state()
        states = torch.zeros(collective.world_size + 1, mine.numel(), dtype=torch.float64)
        states[collective.rank] = mine.double()
        if stats is not None:
            states[-1, :2] = stats[:2]
        collective.all_reduce(states, "sum")
        self.last = time.monotonic()
        rng, workers = [row.to(torch.uint8) for row in states[:-1]], collective.world_size
        epoch_stats = (float(states[-1, 0]), float(states[-1, 1]), seconds)
        if self.shards is not None:
            self._save_shards(epoch, step, history, rng, epoch_stats)
            return
        # gathered on every rank (a sharding strategy's shards), written by rank 0
        model_state, opt_state = self.strategy.model_state(), self.strategy.optimizer_state(self.optimizer)
        if collective.rank != 0:
            return
        # the snapshot: what training changes next is copied now (into the buffers of the previous
        # one, whose write must be done), the rest happens in the background
        self.writer.wait()
        model, strategy_state, optimizer = self.snapshot.take(
            (
                model_state,
                self.strategy.state_dict(),
                optimizer_state(self.optimizer, self.scheduler, opt_state),
            )
        )
        policy, history = self.policy, [*self.spec.part.history, *(dict(h) for h in history)]

        def write() -> None:
            path = save_checkpoint(
                policy,
                epoch=epoch,
                step=step,
                model=model,
                optimizer=state_io.to_bytes(optimizer),
                strategy_state=strategy_state,
                rng=rng,
                history=history,
                workers=workers,
                epoch_stats=epoch_stats,
                model_record=self.model_record,
            )
            log.info("checkpoint %s", path)

        self.writer.submit(write)

    def _save_shards(
        self,
        epoch: int,
        step: int,
        history: list[dict[str, float]],
        rng: list[torch.Tensor],
        epoch_stats: tuple[float, float, float],
    ) -> None:
        """Every rank writes its shards; rank 0 adds the rest of the checkpoint (no model)."""
        assert self.shards is not None
        module = self.strategy.unwrap()
        state = self.strategy.sharded_state(module, self.optimizer)
        tensors, rest = split_tensors(state["optimizer"]["state"])
        if self.collective.rank != 0:  # rank 0 alone writes the loop state
            self.shards.save(epoch, step, module, {"model": state["model"], "optimizer": tensors}, {})
            return
        loop = checkpoint_payload(
            epoch=epoch,
            step=step,
            model={},
            optimizer=optimizer_state_to_bytes(
                self.optimizer,
                self.scheduler,
                {"state": rest, "param_groups": state["optimizer"]["param_groups"]},
            ),
            strategy_state=self.strategy.state_dict(),
            rng=rng,
            history=[*self.spec.part.history, *(dict(h) for h in history)],
            workers=self.collective.world_size,
            epoch_stats=epoch_stats,
            model_record=self.model_record,
        )
        self.shards.save(epoch, step, module, {"model": state["model"], "optimizer": tensors}, loop)

    def close(self) -> None:
        """Wait for the last write; raise its error if it failed."""
        if self.shards is not None:
            self.shards.close()
        self.writer.close()


def _sum_counters(data: WorkerData, collective: Collective) -> dict[str, int]:
    """Sum a data source's optional per-worker ``counters()`` (e.g. rows dropped for nulls) over ranks."""
    counters = getattr(data, "counters", None)
    values = counters() if callable(counters) else {}
    if not values:
        return {}
    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    collective.all_reduce(total, "sum")
    return {k: int(v) for k, v in zip(keys, total.tolist())}
