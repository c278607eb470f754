"""One worker's training: the :class:`Trainer` and the collaborators it runs with.

The trainer seeds the worker, lays out, casts and shards the model, builds the optimizer and
its schedule, resumes both where the stage starts, and runs the epochs. Around the steps it
hands off to its collaborators: the :class:`~sparkdp.train.saver.Saver` writes checkpoints,
the :class:`~sparkdp.train.preempt.PreemptionWatch` says when the ranks agreed to stop, the
:class:`~sparkdp.train.evaluator.Evaluator` computes test metrics after an epoch, and the
worker's :class:`~sparkdp.train.role.WorkerRole` says what this worker does because of its kind
(a sync member saves, agrees and sends back its share of the model; an async worker reports for
itself). What differs between strategies happens in their hooks: ``setup`` (DDP wrap, averaging
hook, parameter-server connection), the optimizer-step hook, ``end_epoch``, ``finish`` and
``evaluation``.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .. import state as state_io
from ..comm.base import Collective
from ..data.base import WorkerData
from ..data.prefetch import prefetch
from ..errors import DataError, TrainingDiverged
from ..frozen import store_frozen_in
from ..monitor.probe import WorkerProbe
from .batch import ModelLoss, batch_rows, call_model, to_device, training_tokens
from .batch_check import check_batch
from .evaluator import Evaluator
from .layout import batch_layout, set_layout, use_channels_last
from .memory import MemoryMeter
from .optim import optimizer_state_to_bytes
from .precision import resolve_precision
from .preempt import PreemptionWatch, preempted
from .report import WorkerReport
from .role import role_of
from .saver import Saver
from .schedule import lr_schedule
from .sharded_checkpoint import restore as restore_shards
from .step import Stepper, with_last
from .tokens import TokenLimits

if TYPE_CHECKING:
    from .spec import FitSpec

log = logging.getLogger(__name__)


class Trainer:
    """The training of ``spec`` by one worker over ``collective``; :meth:`fit` runs it.

    In a barrier stage rank 0 returns the report; the other ranks return None, or a report
    holding only their share of the model's state where the strategy shards it
    (``Strategy.result_state``; the driver joins the shares, ``WorkerReport.joined``); an
    asynchronous worker returns its own, without the model state, which the driver takes from
    the parameter server.
    """

    def __init__(
        self, spec: FitSpec, collective: Collective, probe: WorkerProbe, watch: PreemptionWatch | None = None
    ) -> None:
        self.spec, self.collective, self.probe, self.watch = spec, collective, probe, watch
        self.role = role_of(collective)
        self.strategy, self.training = spec.strategy, spec.training
        self.wall_start = time.time()
        seed_worker(spec, collective)
        self._prepare_model()
        self._prepare_optimizer()
        self.net = self.strategy.setup(self.model, self.optimizer, collective)
        #: what the model's embeddings take; every batch is checked against it (train.tokens)
        self.token_limits = TokenLimits.of(self.strategy.unwrap())
        #: ranks with unequal data stop together at the first that runs out (:func:`synchronized`)
        self.check_exhaustion = not spec.train.equal_batches
        self.history: list[dict[str, float]] = []
        self.train_time, self.samples, self.steps_done = 0.0, 0, 0
        policy = spec.checkpoint if self.role.saves_checkpoints else None
        self.saver = (
            Saver(policy, spec, self.strategy, self.optimizer, self.scheduler, collective)
            if policy is not None
            else None
        )
        self.memory = MemoryMeter()
        self.steps_per_epoch = spec.steps_per_epoch(collective.world_size)
        precision, training = self.precision, self.training
        # the plain path (float32, a step per batch, no clipping, a classic loss) does no extra work per step
        plain = (
            not precision.mixed
            and training.accumulate == 1
            and training.clip_grad_norm is None
            and not isinstance(spec.loss, ModelLoss)
        )
        self.stepper = (
            None
            if plain
            else Stepper(
                self.net, spec.loss, self.optimizer, self.scheduler, self.strategy, precision, training
            )
        )
        self.evaluator = Evaluator(spec, self.channels_last, precision.autocast if precision.mixed else None)

    # -- before the first step -----------------------------------------------------------
    def _prepare_model(self) -> None:
        """The model on the worker's device, in its memory layout and precision, sharded."""
        spec, strategy, device = self.spec, self.strategy, self.collective.device
        model = spec.model.to(device)
        self.channels_last = use_channels_last(self.training.memory_format, model, device)
        self.weights_nhwc = self.channels_last and strategy.channels_last_weights
        if self.weights_nhwc:  # before DDP lays out its buckets and the optimizer its state
            set_layout(model, True)
        self.precision = resolve_precision(self.training.precision, device)
        if self.precision.mixed:
            strategy.adopt_precision(self.precision.dtype)
            # a frozen base in the compute dtype; adapters stay fp32
            store_frozen_in(model, self.precision.dtype)
        # a sharding strategy's optimizer steps the shards
        self.model = strategy.shard(model, self.collective)

    def _prepare_optimizer(self) -> None:
        """The optimizer and its schedule, resumed where the stage starts."""
        spec, training = self.spec, self.training
        self.optimizer = spec.optimizer.build(self.model)
        self.scheduler = spec.scheduler(self.optimizer) if spec.scheduler is not None else None
        if training.lr_schedule != "constant":
            self.scheduler = lr_schedule(
                training, self.optimizer, spec.optimizer_steps(self.collective.world_size)
            )
        part = spec.part
        if not part.optimizer_state:
            return
        saved = state_io.from_bytes(part.optimizer_state)  # what optimizer_state_to_bytes encoded
        if part.shards is not None:  # the weights and the optimizer's tensors, resharded to this world
            settings = spec.checkpoint.settings if spec.checkpoint is not None else None
            restore_shards(
                part.shards,
                self.strategy,
                self.model,
                self.optimizer,
                saved["optimizer"],
                settings.checkpoint_storage_options if settings is not None else None,
            )
        else:
            self.strategy.load_optimizer_state(self.optimizer, saved["optimizer"])
        if self.scheduler is not None and saved["scheduler"] is not None:
            self.scheduler.load_state_dict(saved["scheduler"])  # the schedule continues across stages

    # -- the epochs ----------------------------------------------------------------------
    def fit(self) -> WorkerReport | None:
        """Run the stage's epochs; this worker's report (see the class docstring)."""
        part = self.spec.part
        for epoch in range(part.start_epoch, part.start_epoch + self.spec.epochs):
            stats, elapsed = self._train_epoch(epoch)
            if self._end_epoch(epoch, stats, elapsed):
                break
        if self.saver is not None:
            self.saver.close()  # the job's last checkpoint is written before the worker reports
        self.strategy.finish()
        if self.weights_nhwc:  # what leaves the worker is in the default layout
            set_layout(self.model, False)
        return self._report()

    def _train_epoch(self, epoch: int) -> tuple[torch.Tensor, float]:
        """One epoch's steps: its stats (loss x rows, rows) and seconds."""
        spec, training, part, collective = self.spec, self.training, self.spec.part, self.collective
        strategy, probe, stepper, net = self.strategy, self.probe, self.stepper, self.net
        optimizer, scheduler, channels_last = self.optimizer, self.scheduler, self.channels_last
        rank, device = collective.rank, collective.device
        checkpoints = self.watch is not None or self.saver is not None
        # (progress counts optimizer steps, as warmup_steps does: accumulate batches each)
        steps = self.steps_per_epoch
        probe.start_epoch(
            epoch, None if steps is None else math.ceil(steps / training.accumulate), spec.last_epoch() + 1
        )
        self.model.train()
        started = time.perf_counter()
        stats = torch.zeros(2, dtype=torch.float64)  # loss*rows, rows
        skip = part.start_step if epoch == part.start_epoch else 0
        before = 0.0
        if skip and rank == 0:  # the interrupted epoch's rows so far count once, on rank 0
            stats[0], stats[1], before = part.epoch_stats
        batches = self._batches(epoch, skip)
        ready = time.perf_counter()
        for step, ((x, y), last) in enumerate(batches, start=skip):
            arrived = time.perf_counter()
            probe.batch_arrived(arrived - ready)
            if self.token_limits is not None:  # on the CPU, before the batch moves: no device sync
                self.token_limits.check(x, f"worker {rank}'s batch {step + 1} of epoch {epoch + 1}")
            if isinstance(x, torch.Tensor):
                x, y = batch_layout(x.to(device), channels_last), to_device(y, device)
            else:
                x, y = to_device(x, device), to_device(y, device)
            if epoch == 0 and step == 0:
                self._check_first_batch(x, y)
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
            self.steps_done += 1
            if self.steps_done == 1:  # the optimizer's state exists from the first step on
                self.memory.sample(self.model, optimizer)
            if spec.fault is not None:  # (a "slow" fault's sleep counts as this step's compute)
                spec.fault.maybe_fire(rank, self.steps_done)
            stepped = stepper is None or stepper.stepped
            probe.step_done(
                time.perf_counter() - arrived,
                rows,
                value,
                stepped=stepped,
                tokens=training_tokens(x) if probe.active and not isinstance(x, torch.Tensor) else None,
            )
            # (a checkpoint falls between optimizer steps, never inside a group of micro-batches)
            if stepped and checkpoints:
                self._at_step_boundary(epoch, step + 1, stats, before - started)
            ready = time.perf_counter()
        self.memory.sample(self.model, optimizer)
        strategy.end_epoch()
        return stats, before + time.perf_counter() - started

    def _batches(self, epoch: int, skip: int) -> Iterator[tuple[Any, bool]]:
        """This rank's batches of ``epoch`` after the first ``skip``, prepared ahead, stopping with
        the other ranks, each with whether it ends its group of micro-batches."""
        spec, training, collective = self.spec, self.training, self.collective
        batches = prefetch(
            itertools.islice(
                spec.train.batches(
                    rank=collective.rank,
                    world_size=collective.world_size,
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
        stream = synchronized(batches, collective, self.check_exhaustion)
        # accumulating, a shorter last group of micro-batches must know it is the last
        return with_last(stream) if training.accumulate > 1 else ((b, False) for b in stream)

    def _check_first_batch(self, x: Any, y: Any) -> None:
        """The model and loss take the job's first batch (one clear error where they cannot)."""
        module = self.strategy.unwrap()
        with torch.no_grad():
            check_batch(module, self.spec.loss, x, y)

    def _at_step_boundary(self, epoch: int, step: int, stats: torch.Tensor, offset: float) -> None:
        """After optimizer step ``step`` of ``epoch``: save and stop where the ranks agreed to stop,
        else save where a checkpoint is due. ``offset + time.perf_counter()``: the epoch's seconds."""
        saver, probe = self.saver, self.probe
        if self.watch is not None and (stop := self.watch.step_boundary()):
            if saver is not None:
                saver.save(epoch, step, self.history, stats, offset + time.perf_counter())
                saver.close()
                probe.checkpointed()
            raise preempted(stop, epoch, step, saved=saver is not None)
        if saver is not None and saver.due(step):
            saver.save(epoch, step, self.history, stats, offset + time.perf_counter())
            probe.checkpointed()

    def _end_epoch(self, epoch: int, stats: torch.Tensor, elapsed: float) -> bool:
        """The epoch's record over all ranks, its test metrics and checkpoint; stops for a
        preemption the ranks agreed on. Returns whether the driver asked the job to stop."""
        spec, collective, saver, last = self.spec, self.collective, self.saver, self.spec.last_epoch()
        self.train_time += elapsed
        stop = self.watch.drain() if self.watch is not None else None
        collective.all_reduce(stats, "sum")
        if stats[1].item() == 0:
            raise DataError(
                f"no training rows reached the workers in epoch {epoch + 1}: the data is empty "
                f"({spec.train.describe()}). Check filters upstream and give at least one row."
            )
        self.samples += int(stats[1])
        record = {
            "epoch": epoch + 1,
            "loss": stats[0].item() / max(stats[1].item(), 1.0),
            "samples": int(stats[1]),
            "epoch_time_s": elapsed,
        }
        record.update(self.evaluator.after(epoch, self.strategy, collective))
        self.history.append(record)
        log.info("rank %d epoch %d: %s", collective.rank, epoch + 1, record)
        may_stop = spec.stoppable and epoch < last
        stop_asked = self._send_epoch(record, may_stop)
        if saver is not None:
            saver.save(epoch + 1, 0, self.history)
            self.probe.checkpointed()
        if stop is not None and epoch < last:  # (after the last epoch only the report is left)
            if saver is not None:
                saver.close()
            raise preempted(stop, epoch + 1, 0, saved=saver is not None)
        if may_stop and self._stop_agreed(stop_asked):
            log.info(
                "rank %d: the driver asked the job to stop; stopping after epoch %d",
                collective.rank,
                epoch + 1,
            )
            return True
        return False

    def _send_epoch(self, record: dict[str, Any], may_stop: bool) -> bool:
        """Rank 0 sends the epoch's results to the driver: as a question when the job may stop
        after this epoch, whose answer (the driver's listener has seen these results) says whether
        to. A worker training on its own asks for itself. Whether the driver asked to stop."""
        if self.collective.rank == 0 and not may_stop:
            self.probe.event("epoch", **record)
        elif self.collective.rank == 0:
            return bool(self.probe.ask("epoch", **record).get("stop"))
        elif may_stop and not self.role.agrees_with_peers:
            return bool(self.probe.ask("stop_query", epoch=record["epoch"]).get("stop"))
        return False

    def _stop_agreed(self, stop_asked: bool) -> bool:
        """Whether every rank stops: rank 0's answer, shared by a one-element all-reduce (a worker
        training on its own goes by its own)."""
        if not self.role.agrees_with_peers:
            return stop_asked
        flag = torch.tensor([1.0 if stop_asked else 0.0], dtype=torch.float64)
        self.collective.all_reduce(flag, "sum")
        return flag.item() > 0

    # -- the report ----------------------------------------------------------------------
    def _report(self) -> WorkerReport | None:
        """What this worker hands back; every rank takes part in the collectives gathering it."""
        spec, role, strategy, collective = self.spec, self.role, self.strategy, self.collective
        counters = summed_counters(spec.train, collective)
        memory_table = self.memory.gather(collective)
        # every rank's share of the model (a sharding strategy's shards; the driver joins them)
        state = strategy.result_state(role.rank) if role.returns_model else b""
        opt_state = strategy.optimizer_state(self.optimizer) if spec.part.return_optimizer_state else None
        if not role.leads:
            return (
                None
                if state is None
                else WorkerReport(state=state, history=[], train_time_s=0.0, samples=0, worker=role.rank)
            )
        # rank 0 always holds a share: the whole state, or its shards and the buffers
        assert state is not None
        return WorkerReport(
            state=state,
            history=self.history,
            train_time_s=self.train_time,
            samples=self.samples,
            strategy_options=strategy.options(),
            strategy_state=strategy.state_dict(),
            data_counters=counters,
            optimizer_state=b""
            if opt_state is None
            else optimizer_state_to_bytes(self.optimizer, self.scheduler, opt_state),
            worker=role.rank,
            strategy_metrics={**strategy.comm_stats(), **strategy.metrics()},
            wall_start=self.wall_start,
            wall_end=time.time(),
            memory=memory_table,
        )


def seed_worker(spec: FitSpec, collective: Collective) -> None:
    """A resumed stage continues every rank's random stream where it stopped (same world size);
    otherwise dropout etc. differ per rank and per resumed stage (the initial weights came from
    the driver)."""
    part = spec.part
    if part.rng is not None and len(part.rng) == collective.world_size:
        torch.set_rng_state(part.rng[collective.rank])
    else:
        torch.manual_seed(spec.training.seed + collective.rank + 7919 * part.start_epoch)


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


def summed_counters(data: WorkerData, collective: Collective) -> dict[str, int]:
    """Sum a data source's optional per-worker ``counters()`` (e.g. rows dropped for nulls) over ranks."""
    counters = getattr(data, "counters", None)
    values = counters() if callable(counters) else {}
    if not values:
        return {}
    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    collective.all_reduce(total, "sum")
    return {k: int(v) for k, v in zip(keys, total.tolist())}


__all__ = ["Trainer", "seed_worker", "summed_counters", "synchronized"]
