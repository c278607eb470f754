"""HSDP under a changing quorum (``fault_tolerance="step"``, strategy ``hsdp``).

The job's slots form replica groups of ``shard_size`` consecutive workers (worker ``w`` is shard
``w % shard_size`` of group ``w // shard_size``). Each group holds one copy of the model, sharded
over its workers with FSDP2 on a process group of its own; the quorum is over whole groups
(``driver.quorum``'s ``replica``), as torchft's is over replica groups.

A step: every worker takes its share of the step's rows (split over every worker of the quorum,
as allreduce's step does), the group's backward reduce-scatters the gradients into each worker's
shard, and the quorum sums each shard over the live groups (one quorum process group per shard
index). Each worker then steps the optimizer on its own shard: the update is allreduce's, the mean
gradient over the step's rows, whatever the number of groups left.

A lost worker takes its group out of the quorum at the next boundary; the other groups go on and
take its rows. Its group's live workers wait at the boundary until the replacement arrives; then
the whole group forms a new process group, and each of its workers heals its shard (parameters,
buffers, optimizer and schedule state) from the worker of the same shard index in a live group.

FSDP2 needs the process's default process group, so a worker is one process (a Spark task):
the group's process group is that default, formed again under a new store prefix at each rejoin.
"""

from __future__ import annotations

import copy
import logging
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import state as state_io
from ..comm.quorum_group import QuorumGroup
from ..errors import ProtocolError, TrainingDiverged
from ..strategies.fsdp import PARAM_DTYPES, adapter_units, shard_units
from ..strategies.hsdp import HSDP
from .faults import Fault
from .quorum_client import QuorumClient
from .quorum_messages import Decision
from .report import WorkerReport
from .schedule import lr_schedule
from .spec import FitSpec
from .step_worker import StepLink, StepTrainer

log = logging.getLogger(__name__)


class HSDPSteps(StepTrainer):
    """One worker's shard of its replica group's model, step by step."""

    def __init__(self, spec: FitSpec, link: StepLink, worker: int, fault: Fault | None) -> None:
        super().__init__(spec, link, worker, fault)
        strategy = spec.strategy
        assert isinstance(strategy, HSDP) and strategy.shard_size  # (checked by the driver)
        self.strategy, self.shard = strategy, strategy.shard_size
        self.replica, self.index = divmod(worker, self.shard)
        self.skeleton = copy.deepcopy(self.model).to("meta")  # to shard afresh at a rejoin
        self.formed_in: int | None = None  # the quorum its group's process group formed in
        self.healing: dict[str, Any] | None = None  # a healer's state, loaded once sharded
        self.whole_state: bytes | None = None
        self.shards: list[torch.Tensor] = []  # this worker's shard of each of self.params

    def run(self, client: QuorumClient, store: Any, joining: bool) -> WorkerReport | None:
        try:
            return super().run(client, store, joining)
        finally:
            self.leave_group()

    def group_of(self, decision: Decision, group: QuorumGroup | None, store: Any) -> QuorumGroup | None:
        """Form (or form again) the replica group's process group when this worker starts or
        heals; then the quorum's process group of this worker's shard index."""
        if self.formed_in is None or self.healing is not None:
            try:
                self.form_group(store, decision.quorum)
            except RuntimeError as exc:  # (gloo's connect or its timeout)
                log.info("worker %d: its replica group did not form (%s)", self.worker, exc)
                return None
        if group is not None and group.quorum == decision.quorum:
            return group
        if group is not None:
            group.teardown()
        peers = [m for m in decision.members if m % self.shard == self.index]
        try:
            shard_store = dist.PrefixStore(f"sparkdp-shard-{self.index}/", store)
            return QuorumGroup(
                shard_store, decision.quorum, peers.index(self.worker), len(peers), self.link.pg_timeout_s
            )
        except RuntimeError as exc:
            log.info("worker %d: quorum %d's group did not form (%s)", self.worker, decision.quorum, exc)
            return None

    def form_group(self, store: Any, quorum: int) -> None:
        """The replica group's process group (this process's default) and the model sharded over
        it; a healer's state loaded into this worker's shard."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.leave_group()
        if self.formed_in is not None:  # the old shards belong to the old process group
            self.model = copy.deepcopy(self.skeleton).to_empty(device="cpu")
        prefixed = dist.PrefixStore(f"sparkdp-replica-{self.replica}-{quorum}/", store)
        dist.init_process_group(
            "gloo",
            store=prefixed,
            rank=self.index,
            world_size=self.shard,
            timeout=timedelta(seconds=self.link.pg_timeout_s),
        )
        mesh = init_device_mesh("cpu", (self.shard,))
        policy = MixedPrecisionPolicy(reduce_dtype=PARAM_DTYPES[self.strategy.reduce_dtype])
        reshard = self.strategy.reshard_after_forward
        for name in adapter_units(self.model) + shard_units(self.model, self.strategy.min_params):
            fully_shard(
                self.model.get_submodule(name), mesh=mesh, mp_policy=policy, reshard_after_forward=reshard
            )
        fully_shard(self.model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        self.model.train()
        self.formed_in = quorum
        self.build_optimizer()
        if self.healing is not None:
            healing, self.healing = self.healing, None
            self.restore(healing)

    def build_optimizer(self) -> None:
        """The user's optimizer and schedule over this worker's shards: plain tensors that share
        the sharded parameters' storage, whose gradients are the quorum's sum."""
        sharded = [p for p in self.model.parameters() if p.requires_grad]
        self.params, self.shards = sharded, [_local(p).detach() for p in sharded]
        optimizer = self.spec.optimizer.build(self.model)  # the user's groups and settings, then
        local_of = {id(p): _local(p).detach() for p in self.model.parameters()}
        local_of.update({id(p): local for p, local in zip(sharded, self.shards, strict=True)})
        for group in optimizer.param_groups:  # ... stepping the local shards
            group["params"] = [local_of[id(p)] for p in group["params"]]
        self.optimizer = optimizer
        spec, training = self.spec, self.spec.training
        self.scheduler = spec.scheduler(optimizer) if spec.scheduler is not None else None
        if training.lr_schedule != "constant":
            self.scheduler = lr_schedule(training, optimizer, self.cursor.total_steps)

    def leave_group(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def compute(self, group: QuorumGroup, decision: Decision) -> bool:
        """This worker's rows of the next step through its group's model; each gradient shard
        summed over the quorum's groups."""
        order = self.order_of(self.cursor.epoch_of(self.step))
        step_rows = self.cursor.step_rows(self.step, order)
        rows = self.cursor.my_rows(self.step, decision.rank_of(self.worker), decision.world, order)
        for p in self.params:
            p.grad = None
        # FSDP2 averages over the group's workers: a loss scaled by shard_size makes that a sum
        share = len(rows) / len(step_rows) * self.shard
        try:
            if len(rows):
                sums = self.learn(rows, share)
            else:  # its group's collectives still need this worker's forward and backward
                self.learn(step_rows[:1], 0.0)
                sums = torch.zeros(2, dtype=torch.float64)
            for local, p in zip(self.shards, self.params, strict=True):
                local.grad = _local(p.grad) if p.grad is not None else torch.zeros_like(local)
            grads = [local.grad for local in self.shards if local.grad is not None]
            if not self.reduce(group, [*grads, sums]):
                return False
            dist.all_reduce(sums)  # over the group's shard indices: the whole quorum's rows
        except TrainingDiverged:
            raise
        except RuntimeError as exc:  # a worker of its group was lost: the quorum decides
            log.info("worker %d: step %d failed in its group (%s)", self.worker, self.step + 1, exc)
            return False
        self.pending = sums
        if self.fault is not None:
            self.fault.maybe_fire(self.worker, self.step + 1)
        return True

    def end_epoch(self, group: QuorumGroup | None) -> None:
        super().end_epoch(group)
        if self.step == self.cursor.total_steps:  # the job's last step: every group worker gathers
            from torch.distributed.tensor import DTensor

            whole = {
                name: value.full_tensor() if isinstance(value, DTensor) else value
                for name, value in self.model.state_dict().items()
            }
            self.whole_state = state_io.state_to_bytes(whole)

    def heal_state(self, epoch_ends: bool) -> dict[str, Any]:
        return {
            "shards": {name: _local(p) for name, p in self.model.named_parameters()},
            "buffers": dict(self.model.named_buffers()),
            **self.training_state(epoch_ends),
        }

    def load(self, data: bytes) -> bool:
        """Keep a healer's state until this worker's group has formed and sharded its model
        (``restore`` then checks it against this worker's shards)."""
        state = state_io.from_bytes(data)
        if not isinstance(state, dict) or not isinstance(state.get("shards"), dict):
            raise ProtocolError("the healer's state is not an hsdp shard's (no 'shards' of parameters).")
        self.healing = state
        return bool(state["epoch_ends"])

    def restore(self, state: dict[str, Any]) -> None:
        mine = {name: _local(p) for name, p in self.model.named_parameters()}
        buffers = dict(self.model.named_buffers())
        theirs, their_buffers = state["shards"], state["buffers"]
        if _shapes(theirs) != _shapes(mine) or _shapes(their_buffers) != _shapes(buffers):
            raise ProtocolError(
                "the healer's shard does not match this worker's shard of the model (names or shapes)."
            )
        with torch.no_grad():
            for name, value in mine.items():
                value.copy_(theirs[name])
            for name, value in buffers.items():
                value.copy_(their_buffers[name])
        self.restore_training(state)

    def report(self) -> WorkerReport:
        assert self.whole_state is not None  # gathered at the job's last step
        return WorkerReport(
            state=self.whole_state,
            history=self.history,
            train_time_s=self.train_time,
            samples=sum(int(h["samples"]) for h in self.history),
            strategy_options=self.spec.strategy.options(),
            strategy_state=self.spec.strategy.state_dict(),
            worker=self.worker,
            wall_start=self.wall_start,
            wall_end=time.time(),
        )


def _local(value: torch.Tensor) -> torch.Tensor:
    """This worker's shard of a sharded parameter or gradient (an FSDP2 DTensor): a plain tensor
    on the same storage."""
    from torch.distributed.tensor import DTensor

    assert isinstance(value, DTensor)
    return value.to_local()


def _shapes(tensors: Any) -> dict[str, tuple[int, ...]] | None:
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        return None
    return {name: tuple(value.shape) for name, value in tensors.items()}


__all__ = ["HSDPSteps"]
