"""Checkpoints of a per-step fault-tolerant job (``fault_tolerance="step"``).

Every member of a quorum holds the same state after a committed step, so one writes: the
quorum's lowest rank, at a step boundary whose step the quorum committed, when the job's
checkpoint policy says a save is due (every ``checkpoint_every`` committed steps of an epoch,
every ``checkpoint_every_s`` seconds by its own clock, at every epoch end). The file is an
ordinary synchronous checkpoint (``train.checkpoint``: model, optimizer and scheduler, strategy
state, history, epoch and step; ``sparkdp export`` reads it) with a ``quorum`` part: the row
cursor (epoch, rows of it trained, epoch seed, the order's shape) and the rest of what a healer
sends a joiner (the epoch's sums so far, training time, diloco's outer optimizer).

A job resumed from it (``resume=``, or the controller's restart after every worker was lost)
starts every worker from that state at the step the cursor names, so the epoch's rows trained
before the save are not trained again and the rest are: each row once across the restart. A
mid-epoch cursor resumes only with the same order (rows, seed, shuffling, global batch and
worker slots); an epoch-end one with any.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from .. import state as state_io
from ..errors import ConfigError
from ..export.record import model_record
from .checkpoint import QUORUM_FORMAT, SERIES, Checkpoint, CheckpointPolicy, checkpoint_payload
from .checkpoint_store import BackgroundWriter, sync_position
from .row_cursor import RowCursor

log = logging.getLogger(__name__)

#: what a mid-epoch cursor must share with the job that resumes it (else the order differs)
ORDER_FIELDS = ("data_rows", "seed", "shuffle", "global_batch", "lanes", "order")


def cursor_record(cursor: RowCursor, step: int, order_key: str) -> dict[str, Any]:
    """Where job step ``step`` stands: its epoch, the rows of that epoch trained before it, and
    what the epoch's order depends on."""
    epoch = cursor.epoch_of(step)
    return {
        "epoch": epoch,
        "rows": cursor.rows_before(step) - epoch * cursor.rows,
        "data_rows": cursor.rows,
        "seed": cursor.seed,
        "shuffle": cursor.shuffle,
        "global_batch": cursor.global_batch,
        "lanes": cursor.lanes,
        "order": order_key,
    }


def order_key(order: Any) -> str:
    """What an epoch's order depends on beyond (seed, epoch): a data's own order says; a
    permutation of all rows depends on nothing else."""
    return str(getattr(order, "key", "a permutation of every row"))


class StepCheckpoints:
    """The checkpoints rank 0 of a quorum writes, in the background (one write in flight)."""

    def __init__(self, policy: CheckpointPolicy, cursor: RowCursor, model: torch.nn.Module) -> None:
        self.policy, self.cursor = policy, cursor
        self.every = policy.settings.checkpoint_every
        self.every_s = policy.settings.checkpoint_every_s
        self.last_s = time.monotonic()
        self.record = model_record(model)
        self.writer = BackgroundWriter("sparkdp-step-checkpoints")

    def due(self, step: int, epoch_ended: bool) -> bool:
        """Whether committed job step ``step`` (1-based: steps done) gets a checkpoint."""
        within = step - self.cursor.epoch_of(step - 1) * self.cursor.steps_per_epoch
        return (
            epoch_ended
            or (self.every is not None and within % self.every == 0)
            or (self.every_s is not None and time.monotonic() - self.last_s >= self.every_s)
        )

    def save(self, state: dict[str, Any], order: str) -> None:
        """Write ``state`` (a healer's, taken at committed step ``state["step"]``) with its cursor.
        The tensors are copied here; encoding and writing happen on the writer's thread."""
        state = dict(state)
        step = int(state.pop("step"))
        model = {k: v.detach().clone() for k, v in state.pop("model").items()}
        optimizer = state_io.to_bytes(
            {"optimizer": state.pop("optimizer"), "scheduler": state.pop("scheduler")}
        )
        rest = state_io.to_bytes({k: v for k, v in state.items() if k != "epoch_ends"})
        cursor = cursor_record(self.cursor, step, order)
        sums = state["epoch_sums"].tolist()
        payload = checkpoint_payload(
            epoch=cursor["epoch"],
            step=step - cursor["epoch"] * self.cursor.steps_per_epoch,
            model=model,
            optimizer=optimizer,
            strategy_state=state["strategy"],
            rng=[torch.get_rng_state()],
            history=list(state["history"]),
            workers=self.cursor.lanes,
            epoch_stats=(float(sums[0]), float(sums[1]), 0.0),
            model_record=self.record,
            quorum={
                "format": QUORUM_FORMAT,
                "step": step,
                "cursor": cursor,
                "state": torch.frombuffer(bytearray(rest), dtype=torch.uint8),
            },
        )
        position = sync_position(payload["epoch"], payload["step"])
        manager = self.policy.manager()
        self.last_s = time.monotonic()

        def write() -> None:
            where = manager.save(SERIES, position, payload)
            log.info(
                "checkpoint %s (step %d, epoch %d, %d rows of it trained)",
                where,
                step,
                cursor["epoch"] + 1,
                cursor["rows"],
            )

        self.writer.submit(write)

    def close(self) -> None:
        """Wait for the last write (its error, if it failed, is raised)."""
        self.writer.close()


def start_state(checkpoint: Checkpoint, cursor: RowCursor, order: str) -> tuple[int, bytes]:
    """The job step a job of ``cursor`` resumes ``checkpoint`` at, and the state its workers start
    from (a healer's, as :meth:`StepTrainer.load` reads it). ``order``: the key of the order of
    the checkpoint's epoch as this job would draw it. One clear line for a checkpoint it cannot
    continue exactly once."""
    quorum = checkpoint.quorum
    if quorum is None:
        raise ConfigError(
            f"{checkpoint.path} was written by a fault_tolerance='restart' job, whose row order a "
            "per-step fault-tolerant job does not know. Resume it with fault_tolerance='restart', "
            "or start this job afresh."
        )
    saved = quorum["cursor"]
    mine = cursor_record(cursor, saved["epoch"] * cursor.steps_per_epoch, order)
    if saved["data_rows"] != cursor.rows:
        raise ConfigError(
            f"{checkpoint.path} was saved over {saved['data_rows']} rows; this job's data has {cursor.rows}. "
            "Resume with the data it was trained on, or start afresh."
        )
    differs = [k for k in ORDER_FIELDS if saved[k] != mine[k]]
    step = cursor.step_at(saved["epoch"], saved["rows"]) if not differs or saved["rows"] == 0 else None
    if step is None:
        raise ConfigError(
            f"{checkpoint.path} stopped {saved['rows']} rows into epoch {saved['epoch'] + 1} of an order this "
            f"job draws differently ({', '.join(differs) or 'global batch'}: saved "
            f"{ {k: saved[k] for k in differs} }). Resume with the same workers, batch_size, seed and "
            "data, or from an epoch-end checkpoint."
        )
    optimizer = state_io.from_bytes(checkpoint.optimizer)
    rest = state_io.from_bytes(quorum["state"].numpy().tobytes())
    state = {
        **rest,
        "model": checkpoint.model,
        "optimizer": optimizer["optimizer"],
        "scheduler": optimizer["scheduler"],
        "step": step,
        "epoch_ends": False,  # the epoch's record (and evaluation) was done before the save
    }
    return step, state_io.to_bytes(state)


__all__ = ["StepCheckpoints", "cursor_record", "order_key", "start_state"]
