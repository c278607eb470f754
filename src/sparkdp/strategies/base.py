"""The strategy interface the training loop sees (cf. Lightning Fabric's Strategy, reduced)."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim import Optimizer

from ..comm.base import Collective
from ..comm.shm import DEFAULT_SLOT_BYTES, SharedMemoryCollective, SharedMemoryReducer
from ..frozen import frozen_names, trainable_state
from ..state import state_to_bytes

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle


class Launcher(enum.Enum):
    """How a strategy's workers run on Spark."""

    #: all workers together in one barrier stage, joined by a process group (synchronous);
    #: a failed task fails the stage
    BARRIER = "barrier"
    #: independent Spark tasks around a parameter server (asynchronous; the job controller restarts them)
    TASKS = "tasks"


class CommMeter:
    """What a worker's strategy spent on communication: seconds, bytes sent and received.

    Plain attributes the training thread adds to; a monitoring thread only reads them."""

    __slots__ = ("received", "seconds", "sent")

    def __init__(self) -> None:
        self.seconds, self.sent, self.received = 0.0, 0, 0

    def add(self, seconds: float, sent: int = 0, received: int = 0) -> None:
        self.seconds += seconds
        self.sent += sent
        self.received += received


def ring_bytes(nbytes: int, world: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``nbytes``: 2 (N-1)/N of them."""
    return 2 * (world - 1) * nbytes // max(world, 1)


class Strategy(ABC):
    """Turns a local model + optimizer into a distributed one.

    A strategy object is a small, picklable configuration until :meth:`setup` binds
    it to a collective inside a worker; the training loop then calls
    ``optimizer.step()`` through :meth:`step` and :meth:`end_epoch` at epoch ends.
    """

    #: How the driver starts this strategy's workers (see :class:`Launcher`).
    launcher: Launcher = Launcher.BARRIER
    #: Whether conv weights may train channels-last (``train.layout``); batches go NHWC either way.
    channels_last_weights: bool = True
    #: Whether a worker's communication time is its own (True: asynchronous, it waits for no
    #: peer) or includes waiting for slower peers (synchronous); the straggler detector needs it.
    comm_is_own: bool = False
    name: str = "strategy"
    #: reductions through a shared mapping when every rank is on one host (the synchronous
    #: strategies' option), for those of ``shared_memory_min_bytes`` or more
    shared_memory: bool = False
    shared_memory_min_bytes: int = 1 << 20
    _transport = "process-group"  # what carries the reductions: "process-group" or "shared-memory"
    _hook: RemovableHandle | None  # the optimizer step hook that calls after_step (set by _attach)

    def __init__(self) -> None:
        self.collective: Collective | None = None
        self.model: nn.Module | None = None
        self.optimizer: Optimizer | None = None
        self.comm = CommMeter()

    def adopt_precision(self, dtype: torch.dtype) -> None:
        """The job computes in ``dtype`` (``precision="bf16-mixed"``, ...): a strategy whose own
        parameter copies should follow takes it here, before :meth:`shard`; default: nothing."""

    def shard(self, model: nn.Module, collective: Collective) -> nn.Module:
        """The module the optimizer is built on. Runs on every rank before the optimizer exists;
        default: ``model`` itself (a sharding strategy returns it with sharded parameters)."""
        return model

    @abstractmethod
    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        """Bind to ``collective``; make all ranks start from rank 0's state; return the model to call.

        Implementations call :meth:`_attach` so that :meth:`after_step` runs after
        every ``optimizer.step()`` — the user's optimizer object stays what it was
        (an ``isinstance(opt, Optimizer)`` that LR schedulers rely on keeps holding).
        """

    def _attach(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> None:
        self.collective, self.model, self.optimizer = collective, model, optimizer
        self._hook = optimizer.register_step_post_hook(lambda _opt, _args, _kwargs: self.after_step())

    def _start_together(self, model: nn.Module, collective: Collective, slot_bytes: int) -> None:
        """Every rank from rank 0's parameters and buffers; with :attr:`shared_memory`, reductions
        through a shared mapping of ``slot_bytes`` (at most ``DEFAULT_SLOT_BYTES``) where the ranks
        share a host."""
        if collective.world_size <= 1:
            return
        collective.broadcast_coalesced([t.data for t in [*model.parameters(), *model.buffers()]], src=0)
        if self.shared_memory:
            reducer = SharedMemoryReducer.connect(collective, slot_bytes=min(DEFAULT_SLOT_BYTES, slot_bytes))
            if reducer is not None:
                self.collective = SharedMemoryCollective(collective, reducer, self.shared_memory_min_bytes)
                self._transport = "shared-memory"

    def add_samples(self, n: int) -> None:
        """Tell the strategy how many rows the coming step trained on (for weighted averages)."""

    def after_step(self) -> None:
        """Runs after each ``optimizer.step()``. Default: nothing."""

    def end_epoch(self) -> None:
        """Called on every rank at the end of an epoch, before evaluation."""

    def finish(self) -> None:
        """Called on every rank after the last step: leave all ranks with the same model."""
        hook = getattr(self, "_hook", None)
        if hook is not None:
            hook.remove()
            self._hook = None

    def evaluation(self, collective: Collective, last: bool) -> tuple[nn.Module, Collective] | None:
        """What to evaluate after an evaluated epoch, over which ranks; None: nothing on this rank.

        Default: the trained model, every rank its share (the metrics are all-reduced).
        ``last`` says the epoch is the job's last."""
        return self.unwrap(), collective

    def replicas_agree(self) -> bool:
        """Whether every rank holds the same model now, so rank 0's is the job's (checkpoints
        are taken only then). Default: yes, after every step (gradient all-reduce)."""
        return True

    def comm_stats(self) -> dict[str, float]:
        """Seconds spent communicating and bytes sent/received so far on this worker (live
        monitoring reads them from another thread; ``sparkdp.monitor``)."""
        meter = self.comm
        return {"comm_s": meter.seconds, "bytes_sent": meter.sent, "bytes_recv": meter.received}

    def metrics(self) -> dict[str, Any]:
        """Per-worker communication figures for the job summary (e.g. pushes, pulls). Default: none."""
        return {}

    def unwrap(self) -> nn.Module:
        """The user's module (without DDP or other wrappers)."""
        assert self.model is not None, "setup() must run first"
        return self.model

    def model_state(self) -> dict[str, Any]:
        """The whole model's state dict on rank 0, less any frozen parameters (a frozen base
        never changes: ``sparkdp.frozen``). Every rank calls it (a sharding strategy gathers the
        shards); default: the model's own ``state_dict()``."""
        model = self.unwrap()
        return trainable_state(model, model.state_dict())

    def result_state(self, rank: int) -> bytes | None:
        """This rank's share of the trained model's state for ``fit``'s result, as safetensors
        bytes; every rank calls it and the driver joins the shares (:func:`sparkdp.state.join_parts`).
        Default: rank 0 the whole state dict (:meth:`model_state`), the others None."""
        state = self.model_state()
        return state_to_bytes(state) if rank == 0 else None

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's whole state on rank 0 (every rank calls it); default: its ``state_dict()``."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load what :meth:`optimizer_state` returned (every rank, after :meth:`shard`)."""
        optimizer.load_state_dict(state)

    def saves_shards(self) -> bool:
        """Whether checkpoints hold every rank's own shard of the state (each rank writes its
        own: ``train.sharded_checkpoint``) instead of rank 0's whole state. Default: no."""
        return False

    def sharded_state(self, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
        """``{"model": ..., "optimizer": {"state": ..., "param_groups": ...}}`` as this rank holds
        them, keyed by parameter name (``torch.distributed.checkpoint.state_dict``'s: a sharding
        strategy's tensors are DTensors), for sharded checkpoints; ``model`` is the module
        :meth:`shard` returned. Every rank calls it; an optimizer that has not stepped gets its
        state created first."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        weights, optim = get_state_dict(model, optimizer)
        return {"model": trainable_state(model, weights), "optimizer": optim}

    def load_sharded_state(self, model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load what :meth:`sharded_state` returned (filled from a sharded checkpoint) into ``model``
        and ``optimizer`` (every rank, after :meth:`shard`, before :meth:`setup`)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            # a frozen base is not in the state (sharded_state): the model keeps its own
            options=StateDictOptions(strict=not frozen_names(model)),
        )

    def options(self) -> dict[str, Any]:
        """The strategy's settings, for logs and the JSON summary."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Where the strategy is in its schedule (JSON values and tensors, as ``sparkdp.state``
        stores them), to resume it in a later stage or from a checkpoint. Default: nothing (a
        stateless strategy)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (before :meth:`setup` or after it)."""
