"""Deeplearning4j-style synchronous parameter averaging every ``period`` local steps.

Each worker runs its own optimizer on its shard; every ``period`` steps the
parameters (and floating buffers, optionally the optimizer state) are replaced by
their sample-weighted mean over the workers. With ``period=1``, plain SGD and equal
shards this is exactly single-machine SGD on the union batch (docs/algorithms.md §1);
with larger periods it is local SGD, trading accuracy for ``period``-times less
communication.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.optim import Optimizer

from ..comm.base import Collective
from ..config import check_int
from ..errors import ConfigError
from .base import Strategy, ring_bytes
from .compression import DeltaReducer, check_codec


class ParameterAveraging(Strategy):
    """Average parameters every ``period`` steps.

    Args:
        period: local steps between averaging rounds (an int >= 1) or ``"epoch"``.
            DL4J's guidance: 5-10 is usually safe; 1 is exact but communicates most.
        average_optimizer_state: also average floating optimizer state (momentum
            buffers, Adam moments) — DL4J's ``saveUpdater``. Needed for momentum SGD
            to stay equivalent to single-machine training at ``period=1``.
        shared_memory: as for ``allreduce``: when every rank is on one host, averages of
            ``shared_memory_min_bytes`` or more go through a shared mapping
            (``sparkdp.comm.shm``) instead of gloo's TCP.
        shared_memory_min_bytes: the smallest average sent through shared memory (1 MiB).
        compression: ``"none"``, ``"bf16"``, ``"fp16"`` or ``"int8"``: parameters and buffers
            travel as their change since the last average, compressed with error feedback
            (:mod:`sparkdp.strategies.compression`); averaged optimizer state travels whole.
    """

    name = "average"

    def __init__(
        self,
        period: int | str = 1,
        average_optimizer_state: bool = False,
        shared_memory: bool = True,
        shared_memory_min_bytes: int = 1 << 20,
        compression: str = "none",
    ) -> None:
        super().__init__()
        self.compression = check_codec(compression)
        if period != "epoch" and (not isinstance(period, int) or isinstance(period, bool) or period < 1):
            raise ConfigError(f"period must be a positive integer or 'epoch'; got {period!r}.")
        if period == 1:
            warnings.warn(
                "average with period=1 communicates the whole model every step; the 'allreduce' "
                "strategy gives the same result for SGD with overlapped, bucketed communication.",
                stacklevel=2,
            )
        self.period: int | Literal["epoch"] = (
            "epoch" if period == "epoch" else cast(int, period)
        )  # checked above
        self.average_optimizer_state = bool(average_optimizer_state)
        self.shared_memory = bool(shared_memory)
        self.shared_memory_min_bytes = int(shared_memory_min_bytes)
        self._steps = 0
        self._samples = 0
        self._reducer: DeltaReducer | None = None
        self._anchor: list[torch.Tensor] = []  # the last average, which compressed deltas start from

    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        self._attach(model, optimizer, collective)
        state_bytes = sum(t.numel() * t.element_size() for t in _state_tensors(model))
        # optimizer state (momentum, Adam's moments) can double or triple what one average moves
        self._start_together(model, collective, slot_bytes=3 * state_bytes)
        if self.compression != "none":
            self._reducer = DeltaReducer(self.compression)
            self._anchor = [
                t.detach().clone().float() for t in _state_tensors(model) if t.is_floating_point()
            ]
        return model

    def add_samples(self, n: int) -> None:
        self._pending = n

    def after_step(self) -> None:
        self._steps += 1
        # Unless told the batch size, weight every step equally.
        self._samples += getattr(self, "_pending", 1)
        if self.period != "epoch" and self._steps % self.period == 0:
            self.average()

    def replicas_agree(self) -> bool:
        """Right after an averaging round (mid-epoch); every epoch end averages too."""
        return self.period != "epoch" and self._steps % self.period == 0

    def end_epoch(self) -> None:
        # Evaluation and checkpoints then see one model on every rank. Every rank must
        # call this (it is a collective); a rank with nothing new contributes weight 0.
        self.average()

    def finish(self) -> None:
        self.end_epoch()
        super().finish()

    def average(self) -> None:
        """Replace parameters (and optionally optimizer state) by their sample-weighted mean."""
        assert self.collective is not None and self.model is not None and self.optimizer is not None
        weight = float(self._samples)
        self._samples = 0
        coll = self.collective
        if coll.world_size == 1:
            return
        tensors = [t.data for t in _state_tensors(self.model) if t.is_floating_point()]
        if self.average_optimizer_state:
            tensors += [
                v
                for state in self.optimizer.state.values()
                for v in state.values()
                if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0
            ]
        started = time.perf_counter()
        total = torch.tensor([weight], dtype=torch.float64)
        coll.all_reduce(total, "sum")
        if total.item() == 0:
            return
        if self._reducer is not None:
            params = len(self._anchor)
            wire = self._average_deltas(tensors[:params], weight / total.item())
            tensors = tensors[params:]  # optimizer state, averaged whole below
            self.comm.add(0.0, wire, wire)
            if not tensors:
                self.comm.add(time.perf_counter() - started)
                return
        for t in tensors:
            t.mul_(weight / total.item())
        coll.all_reduce_coalesced(tensors, "sum")
        wire = ring_bytes(sum(t.numel() * t.element_size() for t in tensors), coll.world_size)
        self.comm.add(time.perf_counter() - started, wire, wire)

    def _average_deltas(self, tensors: list[torch.Tensor], share: float) -> int:
        """Move ``tensors`` to the anchor plus the mean change since it, sent compressed; returns
        the bytes sent."""
        assert self._reducer is not None and self.collective is not None
        with torch.no_grad():
            delta = torch.cat(
                [(t.float() - a).reshape(-1) for t, a in zip(tensors, self._anchor, strict=True)]
            )
            mean = self._reducer.start(self.collective, delta.mul_(share)).wait()
            for t, a, part in zip(
                tensors, self._anchor, mean.split([a.numel() for a in self._anchor]), strict=True
            ):
                a.add_(part.view_as(a))
                t.copy_(a)
        return self._reducer.wire_bytes(delta.numel(), self.collective.world_size)

    def state_dict(self) -> dict[str, Any]:
        """The local steps taken so far: the averaging period continues from there."""
        return {"steps": self._steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        steps = state.get("steps", 0)
        check_int("average: a saved state's 'steps'", steps, 0)
        self._steps = steps

    def options(self) -> dict[str, Any]:
        return {
            "period": self.period,
            "average_optimizer_state": self.average_optimizer_state,
            "shared_memory": self.shared_memory,
            "compression": self.compression,
            "parameter_transport": self._transport,
        }


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """What an average moves: the trainable parameters (a frozen base is the same on every rank
    and never changes) and the buffers."""
    return [p for p in model.parameters() if p.requires_grad] + list(model.buffers())
