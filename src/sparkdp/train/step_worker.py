"""The worker of a per-step fault-tolerant job (``fault_tolerance="step"``, strategy ``allreduce``).

Every step has three parts: the worker arrives at the step boundary (``train.quorum_client``),
where the driver's quorum says whether the last step commits and who trains the next one; it
then applies the last step (or drops it, if a member of its quorum was lost), heals a joiner from
its own state when asked, opens the next quorum's process group when the members changed
(``comm.quorum_group``); and it computes the next step's gradient over its part of the step's
rows (``train.row_cursor``), summed over the quorum.

The gradient is the allreduce strategy's: every worker applies the same optimizer step to the
gradient of the mean loss over the step's rows. Here each worker scales its loss by its share of
the step's rows and the quorum sums the gradients, so the step is the same whatever the number of
workers left. A step is applied only once the quorum has seen every member's collective succeed,
so a lost worker costs the step in flight, never a restart, a reload or an applied step twice.
(``train.step_diloco`` runs ``diloco``'s rounds on the same skeleton.)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from .. import state as state_io
from ..comm.quorum_group import QuorumGroup, store_client
from ..errors import ConfigError, ProtocolError, TrainingDiverged
from ..ps.transport.base import ConnectInfo
from .batch import forward_loss
from .evaluator import evaluate
from .faults import Fault
from .quorum_client import QuorumClient
from .quorum_messages import JOINING, Decision
from .report import WorkerReport
from .row_cursor import RowCursor, RowOrder
from .schedule import lr_schedule
from .spec import FitSpec
from .step_checkpoint import StepCheckpoints, order_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepLink:
    """What every slot's task needs to join the job's quorum (built by the driver)."""

    quorum: ConnectInfo
    store: tuple[str, int]
    workers: int
    threads: int | None
    pg_timeout_s: float
    wait_s: float
    #: a resumed job's state (a checkpoint's, as a healer sends it): every worker starts from it
    start: bytes | None = None


def step_cursor(spec: FitSpec, workers: int, batches: int = 1) -> RowCursor:
    """The job's row cursor: ``batches`` batches of ``batch_size`` rows per worker a step, the
    global batch constant."""
    rows = spec.train.num_samples()
    if rows is None:
        raise ConfigError("fault_tolerance='step' needs data whose row count is known (in-memory arrays).")
    training = spec.training
    global_batch = training.batch_size * workers * batches
    return RowCursor(rows, global_batch, training.epochs, training.seed, training.shuffle, lanes=workers)


def fit_step_worker(
    spec: FitSpec,
    link: StepLink,
    worker: int,
    *,
    joining: bool,
    fault: Fault | None,
    trainer_class: type[StepTrainer] | None = None,
) -> WorkerReport | None:
    """Slot ``worker``'s part of the job: from its first boundary (a replacement heals there) to
    the job's last step. ``trainer_class``: the strategy's (default: allreduce's step). The report
    of the final quorum's rank 0; None from the others."""
    torch.set_num_threads(link.threads or 1)
    trainer = (trainer_class or StepTrainer)(spec, link, worker, fault)
    client = QuorumClient(link.quorum, worker, wait_s=link.wait_s)
    try:
        store = store_client(link.store[0], link.store[1], link.pg_timeout_s)
        report = trainer.run(client, store, joining)
    except BaseException:
        client.abandon()
        raise
    client.close()
    return report


class StepTrainer:
    """One worker's model, optimizer and place in the job, step by step."""

    def __init__(self, spec: FitSpec, link: StepLink, worker: int, fault: Fault | None) -> None:
        self.spec, self.link, self.worker, self.fault = spec, link, worker, fault
        torch.manual_seed(spec.training.seed + worker)
        self.model = spec.model
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = spec.optimizer.build(self.model)
        self.cursor = self.cursor_for(spec, link.workers)
        self.scheduler = spec.scheduler(self.optimizer) if spec.scheduler is not None else None
        if spec.training.lr_schedule != "constant":
            self.scheduler = lr_schedule(spec.training, self.optimizer, self.cursor.total_steps)
        self.step = 0  # the job's committed steps
        self.history: list[dict[str, Any]] = []
        self.epoch_sums = torch.zeros(2, dtype=torch.float64)  # loss x rows, rows of committed steps
        self.pending: torch.Tensor | None = None  # the same, of the step computed since the last boundary
        self.train_time, self.epoch_start = 0.0, time.perf_counter()
        self.wall_start = time.time()
        self._order: tuple[int, RowOrder] | None = None
        policy = spec.checkpoint
        self.checkpoints = StepCheckpoints(policy, self.cursor, self.model) if policy is not None else None

    @classmethod
    def cursor_for(cls, spec: FitSpec, workers: int) -> RowCursor:
        """The job's row cursor: a step of ``batch_size`` rows per worker of the job."""
        return step_cursor(spec, workers)

    def run(self, client: QuorumClient, store: Any, joining: bool) -> WorkerReport | None:
        ok: bool | None = None
        group: QuorumGroup | None = None
        if self.link.start is not None:
            self.load(self.link.start)
        while True:
            decision, state = client.boundary(JOINING if joining else self.step, ok)
            if decision.done and self.worker not in decision.members:
                return None  # a replacement that came too late: nothing is left to train
            epoch_ends = self.load(state) if state is not None else self.settle(decision.commit)
            joining = False
            if decision.heal_to:
                client.heal(decision.heal_to, self.state_bytes(epoch_ends))
            group = self.group_of(decision, group, store)
            if epoch_ends:
                self.end_epoch(group)
            if decision.commit and decision.rank_of(self.worker) == 0:
                self.checkpoint(epoch_ends)
            if decision.done:
                if group is not None:
                    group.teardown()
                if self.checkpoints is not None:
                    self.checkpoints.close()
                return self.report() if decision.rank_of(self.worker) == 0 else None
            ok = self.compute(group, decision) if group is not None else False

    def checkpoint(self, epoch_ends: bool) -> None:
        """Save the committed state with its cursor when the job's checkpoint policy says so."""
        if self.checkpoints is not None and self.checkpoints.due(self.step, epoch_ends):
            order = self.order_of(min(self.cursor.epoch_of(self.step), self.cursor.epochs - 1))
            self.checkpoints.save(self.heal_state(False), order_key(order))

    def group_of(self, decision: Decision, group: QuorumGroup | None, store: Any) -> QuorumGroup | None:
        """The process group of ``decision``'s quorum: ``group`` while the quorum is the same, else
        a new one; None when a member was lost while it formed (the quorum decides at the boundary)."""
        if group is not None and group.quorum == decision.quorum:
            return group
        if group is not None:
            group.teardown()
        try:
            rank = decision.rank_of(self.worker)
            return QuorumGroup(store, decision.quorum, rank, decision.world, self.link.pg_timeout_s)
        except RuntimeError as exc:  # (gloo's connect or its timeout)
            log.info("worker %d: quorum %d's group did not form (%s)", self.worker, decision.quorum, exc)
            return None

    def settle(self, commit: bool) -> bool:
        """Apply the step computed since the last boundary (``commit``) or drop it; whether an
        epoch ended with it."""
        pending, self.pending = self.pending, None
        if not commit or pending is None:
            return False
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.epoch_sums += pending
        self.step += 1
        return self.cursor.ends_epoch(self.step - 1)

    def compute(self, group: QuorumGroup, decision: Decision) -> bool:
        """This worker's part of the next step, summed over the quorum; False when a collective
        failed (a member was lost: the quorum drops the step and runs it again)."""
        order = self.order_of(self.cursor.epoch_of(self.step))
        total = len(self.cursor.step_rows(self.step, order))
        rows = self.cursor.my_rows(self.step, decision.rank_of(self.worker), decision.world, order)
        for p in self.params:
            p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
        sums = self.learn(rows, len(rows) / total) if len(rows) else torch.zeros(2, dtype=torch.float64)
        if not self.reduce(group, [*(p.grad for p in self.params if p.grad is not None), sums]):
            return False
        self.pending = sums
        if self.fault is not None:
            self.fault.maybe_fire(self.worker, self.step + 1)
        return True

    def order_of(self, epoch: int) -> RowOrder:
        """Epoch ``epoch``'s order of the rows (kept while the epoch lasts)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self.cursor.order(epoch, self.spec.train))
        return self._order[1]

    def learn(self, rows: torch.Tensor, scale: float) -> torch.Tensor:
        """The gradient of ``scale`` times the mean loss over ``rows``, added to the parameters'
        gradients; the rows' loss sum and count."""
        x, y = self.spec.train.rows_at(rows)  # type: ignore[attr-defined]  # checked by the driver
        loss, _ = forward_loss(self.model, self.spec.loss, x, y)  # (dict batches, loss="model" too)
        (loss * scale).backward()
        value = loss.detach().item()
        if not math.isfinite(value):
            raise TrainingDiverged(
                f"worker {self.worker}: the loss is {value} at step {self.step + 1}; lower the learning rate."
            )
        return torch.tensor([value * len(rows), float(len(rows))], dtype=torch.float64)

    def reduce(self, group: QuorumGroup, tensors: list[torch.Tensor]) -> bool:
        """Sum ``tensors`` over the quorum in place; False when a peer was lost mid-step."""
        try:
            group.all_reduce_coalesced(tensors)
        except RuntimeError as exc:  # the quorum decides at the boundary
            log.info("worker %d: step %d's collective failed (%s)", self.worker, self.step + 1, exc)
            # Leave the broken group now: a peer that is not the lost worker's neighbour waits on
            # this worker's sockets, and would otherwise block until pg_timeout_s. (A failed step
            # always gets a new quorum number, so this group is never used again.)
            group.teardown()
            return False
        return True

    def end_epoch(self, group: QuorumGroup | None) -> None:
        """The epoch's record (its committed rows' loss) and, when due, the test metrics."""
        epoch = self.cursor.epoch_of(self.step - 1)
        elapsed = time.perf_counter() - self.epoch_start
        loss_rows, rows = self.epoch_sums.tolist()
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": loss_rows / max(rows, 1.0),
            "samples": int(rows),
            "epoch_time_s": elapsed,
        }
        if self.spec.evaluates_after(epoch):
            record.update(self.evaluate(group))
        self.history.append(record)
        self.train_time += elapsed
        self.epoch_sums.zero_()
        self.epoch_start = time.perf_counter()

    def evaluate(self, group: QuorumGroup | None) -> dict[str, float]:
        spec = self.spec
        assert spec.eval is not None  # evaluates_after holds only with evaluation data

        def over(collective: QuorumGroup) -> dict[str, float]:
            return evaluate(
                self.model,
                spec.loss,
                spec.eval,  # type: ignore[arg-type]
                collective,
                spec.eval_batch_size,
                metric=spec.metric,
                metric_names=spec.metric_names,
            )

        alone = QuorumGroup(None, -1, 0, 1, self.link.pg_timeout_s)
        try:
            return over(group if group is not None else alone)
        except RuntimeError:  # a member was lost while evaluating: every survivor evaluates alone
            self.model.train()
            return over(alone)

    def state_bytes(self, epoch_ends: bool) -> bytes:
        """Everything a joiner needs to continue as this worker does (sparkdp state bytes)."""
        return state_io.to_bytes(self.heal_state(epoch_ends))

    def heal_state(self, epoch_ends: bool) -> dict[str, Any]:
        return {"model": self.model.state_dict(), **self.training_state(epoch_ends)}

    def training_state(self, epoch_ends: bool) -> dict[str, Any]:
        """A heal's state besides the model's: optimizer, schedule, strategy and the job's place."""
        keeps_state = self.scheduler is not None and hasattr(self.scheduler, "state_dict")
        sched = self.scheduler.state_dict() if keeps_state else None  # type: ignore[union-attr]
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if sched is None else {k: v for k, v in sched.items() if not callable(v)},
            "strategy": self.spec.strategy.state_dict(),
            "step": self.step,
            "history": self.history,
            "epoch_sums": self.epoch_sums,
            "train_time": self.train_time,
            "epoch_ends": epoch_ends,
        }

    def load(self, data: bytes) -> bool:
        """Continue from a healer's state, checked against this worker's own model first; whether
        the healer's last step ended an epoch."""
        state = state_io.from_bytes(data)
        mine = self.model.state_dict()
        theirs = state.get("model") if isinstance(state, dict) else None
        if not isinstance(theirs, dict) or {k: tuple(v.shape) for k, v in theirs.items()} != {
            k: tuple(v.shape) for k, v in mine.items()
        }:
            raise ProtocolError(
                "the healer's model state does not match this worker's model (names or shapes)."
            )
        self.restore(state)
        return bool(state["epoch_ends"])

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.restore_training(state)

    def restore_training(self, state: dict[str, Any]) -> None:
        """Load what :meth:`training_state` holds: optimizer, schedule, strategy and position."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.spec.strategy.load_state_dict(state["strategy"])
        self.step, self.history = int(state["step"]), list(state["history"])
        self.epoch_sums = state["epoch_sums"].clone()
        self.train_time, self.pending = float(state["train_time"]), None

    def report(self) -> WorkerReport:
        return WorkerReport(
            state=state_io.state_to_bytes(self.model.state_dict()),
            history=self.history,
            train_time_s=self.train_time,
            samples=sum(int(h["samples"]) for h in self.history),
            strategy_options=self.spec.strategy.options(),
            strategy_state=self.spec.strategy.state_dict(),
            worker=self.worker,
            wall_start=self.wall_start,
            wall_end=time.time(),
        )


__all__ = ["StepLink", "StepTrainer", "fit_step_worker", "step_cursor"]
