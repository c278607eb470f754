"""A synchronous job's checkpoints as its workers write them while they train.

Every rank calls the saver at the same steps (the ranks agree on when, through the collective);
the state is gathered there, rank 0 copies it to host memory and a background thread writes it,
or, where the strategy shards the state, every rank writes its own shards
(``train.sharded_checkpoint``). Where checkpoints go, what they hold and how a job resumes
from one: ``train.checkpoint``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from .. import state as state_io
from ..comm.base import Collective
from ..export.record import model_record
from ..strategies.base import Strategy
from .checkpoint import CheckpointPolicy, checkpoint_payload, save_checkpoint
from .checkpoint_store import BackgroundWriter, HostSnapshot
from .optim import optimizer_state, optimizer_state_to_bytes
from .sharded_checkpoint import ShardedSaver, split_tensors

if TYPE_CHECKING:
    from .spec import FitSpec

log = logging.getLogger(__name__)


class Saver:
    """Rank 0 saves where every rank agrees to: every ``checkpoint_every`` steps of an epoch, when
    ``checkpoint_every_s`` passed (agreed every 8 steps by one MAX all-reduce), and at epoch ends.

    The training thread only copies the state to host memory; a background writer serializes,
    writes, commits and rotates it (one write in flight; :class:`BackgroundWriter`)."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        spec: FitSpec,
        strategy: Strategy,
        optimizer: torch.optim.Optimizer,
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


__all__ = ["Saver"]
