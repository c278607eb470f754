"""DiLoCo under a changing quorum (``fault_tolerance="step"``, strategy ``diloco``).

A quorum step is one outer round: every worker runs ``period`` inner steps of the user's optimizer
over its part of the round's rows (``period`` global batches of the epoch's order, split between
the round's workers), then the quorum sums each worker's change from the round's start, weighted
by its share of the round's rows, and the outer optimizer applies that mean change to the outer
parameters, identical on every worker (``strategies.diloco``'s update, with the workers weighted
by rows so a round means the same whatever the quorum).

A round that does not commit (a member was lost) is dropped everywhere: each worker goes back to
the round's start, inner optimizer and schedule included, and the next quorum runs the same round
again with the same rows. A joiner heals with the outer optimizer's state (its momentum) and the
healer's inner optimizer state beside the parameters.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..comm.quorum_group import QuorumGroup
from ..strategies.diloco import DiLoCo
from .faults import Fault
from .quorum_messages import Decision
from .row_cursor import RowCursor
from .schedule import lr_schedule
from .spec import FitSpec
from .step_worker import StepLink, StepTrainer, step_cursor


class DiLoCoRounds(StepTrainer):
    """One worker's DiLoCo, a quorum step per outer round."""

    def __init__(self, spec: FitSpec, link: StepLink, worker: int, fault: Fault | None) -> None:
        super().__init__(spec, link, worker, fault)
        strategy = spec.strategy
        assert isinstance(strategy, DiLoCo)  # (the driver chose this trainer for it)
        self.period, training = strategy.period, spec.training
        if training.lr_schedule != "constant":  # the schedule counts inner steps
            self.scheduler = lr_schedule(training, self.optimizer, self.cursor.total_steps * self.period)
        self.start = [p.detach().clone() for p in self.params]
        self.outer = strategy.outer_optimizer_for(self.start)
        self.delta: list[torch.Tensor] | None = None
        self.saved = self.inner_state()

    @classmethod
    def cursor_for(cls, spec: FitSpec, workers: int) -> RowCursor:
        """A round's rows: ``period`` global batches."""
        assert isinstance(spec.strategy, DiLoCo)
        return step_cursor(spec, workers, spec.strategy.period)

    def inner_state(self) -> dict[str, Any]:
        """The inner optimizer's and the schedule's state at the round's start (to go back to)."""
        keeps_state = self.scheduler is not None and hasattr(self.scheduler, "state_dict")
        return copy.deepcopy(
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if keeps_state else None,  # type: ignore[union-attr]
            }
        )

    def compute(self, group: QuorumGroup, decision: Decision) -> bool:
        order = self.order_of(self.cursor.epoch_of(self.step))
        total = len(self.cursor.step_rows(self.step, order))
        rows = self.cursor.my_rows(self.step, decision.rank_of(self.worker), decision.world, order)
        sums = torch.zeros(2, dtype=torch.float64)
        for chunk in torch.tensor_split(rows, self.period):
            if len(chunk):
                self.optimizer.zero_grad(set_to_none=True)
                sums += self.learn(chunk, 1.0)
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
        share = len(rows) / total
        delta = [(g - p.detach()) * share for g, p in zip(self.start, self.params, strict=True)]
        if not self.reduce(group, [*delta, sums]):
            return False
        self.pending, self.delta = sums, delta
        if self.fault is not None:
            self.fault.maybe_fire(self.worker, self.step + 1)
        return True

    def settle(self, commit: bool) -> bool:
        pending, delta = self.pending, self.delta
        self.pending = self.delta = None
        if commit and pending is not None and delta is not None:
            for g, d in zip(self.start, delta, strict=True):
                g.grad = d
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)
        with torch.no_grad():  # every worker on the outer parameters: the new ones, or the round's start
            for p, g in zip(self.params, self.start, strict=True):
                p.copy_(g)
        if not commit or pending is None:
            self.optimizer.load_state_dict(copy.deepcopy(self.saved["optimizer"]))
            if self.saved["scheduler"] is not None and self.scheduler is not None:
                self.scheduler.load_state_dict(self.saved["scheduler"])
            return False
        self.saved = self.inner_state()
        self.epoch_sums += pending
        self.step += 1
        return self.cursor.ends_epoch(self.step - 1)

    def heal_state(self, epoch_ends: bool) -> dict[str, Any]:
        return {**super().heal_state(epoch_ends), "outer": self.outer.state_dict()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        with torch.no_grad():
            for g, p in zip(self.start, self.params, strict=True):
                g.copy_(p)
        self.outer.load_state_dict(state["outer"])
        self.saved, self.delta = self.inner_state(), None


__all__ = ["DiLoCoRounds"]
