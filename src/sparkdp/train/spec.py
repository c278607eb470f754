"""What a worker is given to train: the job's spec (:class:`FitSpec`), shipped to each Spark task,
and the part of a longer job it runs (:class:`StagePart`). Its own module, so the trainer and its
collaborators can name the spec without importing the entry point that runs them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..config import TrainingConfig
from ..data.base import WorkerData
from ..data.prefetch import DEFAULT_DEPTH
from ..monitor.probe import MonitorLink
from ..strategies.base import Strategy
from .checkpoint import CheckpointPolicy
from .faults import Fault
from .optim import OptimizerFactory


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
    #: rows per evaluation forward pass: 128 ran 0.31 ms/image where 256 ran 0.41 and 1000 ran
    #: 0.46 on one CPU thread (the 2-conv CNN, channels-last, 5,000 images; larger batches'
    #: activations no longer fit in cache)
    eval_batch_size: int = 128
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
    #: the driver may ask the job to stop after an epoch (a search prunes a trial): rank 0 sends
    #: each epoch's results as a question and all ranks stop after the epoch the answer says
    stoppable: bool = False

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


__all__ = ["FitSpec", "StagePart"]
