"""DiLoCo: local inner steps, then an outer optimizer applies the workers' mean parameter change.

Every worker runs the user's optimizer (the *inner* optimizer) on its own shard for ``period``
(H) steps; then the workers' mean change from the shared start ``g`` is the gradient of an
*outer* optimizer, identical on every rank. ``fragments=P`` syncs the model in P byte-balanced
pieces at evenly spaced offsets within each period (Streaming DiLoCo); ``overlap_steps=τ``
finishes each fragment's reduction τ inner steps later (``mixing``). Each epoch ends with a
blocking outer step of every fragment, so evaluation and checkpoints see one model.

docs/algorithms.md §10 gives the update, its sources and the equivalences the tests check.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from ..comm.base import Collective, Pending
from ..config import check_int
from ..errors import ConfigError
from .base import Strategy, ring_bytes
from .compression import DeltaReducer, check_codec

OuterFactory = Callable[[list[torch.Tensor]], Optimizer]


class DiLoCo(Strategy):
    """Inner optimizer for ``period`` steps, then an outer step on the mean parameter change.

    Args:
        period: inner steps between outer steps (H). The paper used 500 for language models;
            on small models tens of steps keep accuracy.
        outer_optimizer: ``"sgd"`` (with ``outer_momentum``, ``outer_nesterov``), the name of
            another ``torch.optim`` optimizer (made with ``lr=outer_lr``), or, from Python, a
            callable that builds the optimizer from a list of tensors.
        outer_lr: the outer learning rate (0.7).
        outer_momentum: the outer SGD momentum (0.9).
        outer_nesterov: Nesterov momentum for the outer SGD (on).
        fragments: sync the model in this many pieces, one every ``period / fragments`` steps.
        overlap_steps: finish each fragment's reduction this many inner steps after starting
            it (0: at once); less than ``period / fragments``.
        mixing: with overlap, how much of the local parameters is kept when the new outer
            parameters arrive (``θ ← mixing·θ + (1 − mixing)·g``).
        compression: ``"none"``, ``"bf16"``, ``"fp16"`` or ``"int8"`` for the deltas (with error
            feedback; :mod:`sparkdp.strategies.compression`).
        shared_memory: reduce through a shared mapping when every rank is on one host.
        shared_memory_min_bytes: the smallest reduction sent through shared memory (1 MiB).
    """

    name = "diloco"

    def __init__(
        self,
        period: int = 50,
        outer_optimizer: str | OuterFactory = "sgd",
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        outer_nesterov: bool = True,
        fragments: int = 1,
        overlap_steps: int = 0,
        mixing: float = 0.5,
        compression: str = "none",
        shared_memory: bool = True,
        shared_memory_min_bytes: int = 1 << 20,
    ) -> None:
        super().__init__()
        check_int("diloco: period", period)
        check_int("diloco: fragments", fragments)
        check_int("diloco: overlap_steps", overlap_steps, 0)
        if fragments > period:
            raise ConfigError(
                f"diloco: fragments ({fragments}) cannot exceed period ({period}): each fragment "
                "is synced at its own step within the period."
            )
        if overlap_steps and overlap_steps >= period // fragments:
            raise ConfigError(
                f"diloco: overlap_steps ({overlap_steps}) must be less than period / fragments "
                f"({period // fragments}), so a fragment's reduction ends before its next one starts."
            )
        if not 0.0 <= float(mixing) <= 1.0:
            raise ConfigError(f"diloco: mixing must be in [0, 1]; got {mixing!r}.")
        if isinstance(outer_optimizer, str):
            _outer_class(outer_optimizer)  # an unknown name fails here, on the driver
        elif not callable(outer_optimizer):
            raise ConfigError(
                "diloco: outer_optimizer must be an optimizer name such as 'sgd' or 'adam', or a "
                f"callable that builds one from a list of tensors; got {outer_optimizer!r}."
            )
        if float(outer_lr) <= 0:
            raise ConfigError(f"diloco: outer_lr must be > 0; got {outer_lr!r}.")
        self.period, self.fragments, self.overlap_steps = period, fragments, overlap_steps
        self.outer_optimizer, self.outer_lr = outer_optimizer, float(outer_lr)
        self.outer_momentum, self.outer_nesterov = float(outer_momentum), bool(outer_nesterov)
        self.mixing = float(mixing)
        self.compression = check_codec(compression)
        self.shared_memory, self.shared_memory_min_bytes = bool(shared_memory), int(shared_memory_min_bytes)
        self._steps = 0
        self._loaded_outer: dict[str, Any] | None = None
        self._agree = True

    # -- setup ------------------------------------------------------------------------------

    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        self._attach(model, optimizer, collective)
        params = [p for p in model.parameters() if p.requires_grad]
        self._start_together(model, collective, slot_bytes=sum(p.numel() * p.element_size() for p in params))
        self._params = params
        self._outer_params = [p.detach().clone().float() for p in params]
        self._outer = self.outer_optimizer_for(self._outer_params)
        if self._loaded_outer is not None:
            self._outer.load_state_dict(self._loaded_outer)
            self._loaded_outer = None
        self._groups = _fragments(params, self.fragments)
        self._offsets = [
            ((f + 1) * self.period // self.fragments) % self.period for f in range(self.fragments)
        ]
        self._samples = [0] * self.fragments
        self._pending: dict[int, tuple[int, Pending]] = {}  # fragment -> (step it is due, its reduction)
        self._reducer = DeltaReducer(self.compression)
        return model

    def outer_optimizer_for(self, tensors: list[torch.Tensor]) -> Optimizer:
        """The outer optimizer over ``tensors`` (the outer parameters), as the options say."""
        if callable(self.outer_optimizer):
            return self.outer_optimizer(tensors)
        cls = _outer_class(self.outer_optimizer)
        if cls is torch.optim.SGD:
            return torch.optim.SGD(
                tensors,
                lr=self.outer_lr,
                momentum=self.outer_momentum,
                nesterov=self.outer_nesterov and self.outer_momentum > 0,
            )
        return cls(tensors, lr=self.outer_lr)  # type: ignore[call-arg]  # every torch.optim class takes lr

    # -- the schedule -----------------------------------------------------------------------

    def add_samples(self, n: int) -> None:
        self._pending_rows = n

    def after_step(self) -> None:
        self._steps += 1
        self._agree = False
        rows = getattr(self, "_pending_rows", 1)
        self._samples = [s + rows for s in self._samples]
        for fragment, (due, _) in list(self._pending.items()):
            if self._steps >= due:
                self._finish(fragment, mix=True)
        phase = self._steps % self.period
        for fragment, offset in enumerate(self._offsets):
            if phase == offset:
                self._start(fragment)
                if not self.overlap_steps:
                    self._finish(fragment, mix=False)
        if self.fragments == 1 and not self.overlap_steps and phase == 0:
            self._agree = True

    def replicas_agree(self) -> bool:
        """Right after a blocking outer step of the whole model (and after every epoch end)."""
        return self._agree

    def end_epoch(self) -> None:
        # Evaluation and checkpoints see one model: finish what is in flight, then a blocking
        # outer step of every fragment (a fragment with no new rows anywhere is skipped).
        for fragment in list(self._pending):
            self._finish(fragment, mix=True)
        for fragment in range(self.fragments):
            self._start(fragment)
            self._finish(fragment, mix=False)
        self._agree = True

    def finish(self) -> None:
        self.end_epoch()
        super().finish()

    # -- one fragment's round ---------------------------------------------------------------

    def _start(self, fragment: int) -> None:
        """Begin reducing the sample-weighted mean of this fragment's delta ``g − θ``."""
        assert self.collective is not None
        coll = self.collective
        started = time.perf_counter()
        mine = float(self._samples[fragment])
        self._samples[fragment] = 0
        total = mine
        if coll.world_size > 1:
            weights = torch.tensor([mine], dtype=torch.float64)
            coll.all_reduce(weights, "sum")  # a few bytes; each rank's share needs the total
            total = weights.item()
        if total == 0:  # no rows anywhere since this fragment's last round: nothing moved
            return
        indices = self._groups[fragment]
        with torch.no_grad():
            delta = torch.cat(
                [(self._outer_params[i] - self._params[i].detach().float()).reshape(-1) for i in indices]
            )
            delta.mul_(mine / total)
        if coll.world_size == 1:
            pending = Pending(lambda: delta)
        else:
            pending = self._reducer.start(coll, delta, fragment)
            sent = self._reducer.wire_bytes(delta.numel(), coll.world_size)
            self.comm.add(0.0, sent, sent)
        self._pending[fragment] = (self._steps + self.overlap_steps, pending)
        self.comm.add(time.perf_counter() - started)

    def _finish(self, fragment: int, mix: bool) -> None:
        """Apply the outer step to this fragment's outer parameters and move the model there."""
        entry = self._pending.pop(fragment, None)
        if entry is None:
            return
        _, pending = entry
        started = time.perf_counter()
        mean_delta = pending.wait()
        indices = self._groups[fragment]
        outer = self._outer
        for group in outer.param_groups:
            for t in group["params"]:
                t.grad = None
        for i, part in zip(
            indices, mean_delta.split([self._outer_params[i].numel() for i in indices]), strict=True
        ):
            self._outer_params[i].grad = part.view_as(self._outer_params[i]).clone()
        outer.step()
        keep = self.mixing if mix and self.overlap_steps else 0.0
        with torch.no_grad():
            for i in indices:
                new = self._outer_params[i].to(self._params[i].dtype)
                if keep:
                    self._params[i].mul_(keep).add_(new, alpha=1.0 - keep)
                else:
                    self._params[i].copy_(new)
        if fragment == self.fragments - 1:
            self._average_buffers()
        self.comm.add(time.perf_counter() - started)

    def _average_buffers(self) -> None:
        """Floating buffers (BatchNorm statistics) are averaged, not outer-optimized."""
        assert self.collective is not None and self.model is not None
        buffers = [b.data for b in self.model.buffers() if b.is_floating_point()]
        if buffers and self.collective.world_size > 1:
            self.collective.all_reduce_coalesced(buffers, "mean")
            wire = ring_bytes(sum(b.numel() * b.element_size() for b in buffers), self.collective.world_size)
            self.comm.add(0.0, wire, wire)

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The inner steps taken and the outer optimizer's state (its momentum)."""
        outer = getattr(self, "_outer", None)
        # on the host, for checkpoints; load_state_dict moves it to the parameters' device
        return {
            "steps": self._steps,
            "outer": _on_cpu(outer.state_dict()) if outer is not None else self._loaded_outer,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        steps = state.get("steps", 0)
        check_int("diloco: a saved state's 'steps'", steps, 0)
        outer = state.get("outer")
        if outer is not None and not isinstance(outer, dict):
            raise ConfigError(
                f"diloco: a saved state's 'outer' must be an optimizer state; got {type(outer).__name__}."
            )
        self._steps = steps
        if outer is not None and getattr(self, "_outer", None) is not None:
            self._outer.load_state_dict(outer)
        else:
            self._loaded_outer = outer

    def options(self) -> dict[str, Any]:
        name = self.outer_optimizer if isinstance(self.outer_optimizer, str) else "custom"
        return {
            "period": self.period,
            "outer_optimizer": name,
            "outer_lr": self.outer_lr,
            "outer_momentum": self.outer_momentum,
            "outer_nesterov": self.outer_nesterov,
            "fragments": self.fragments,
            "overlap_steps": self.overlap_steps,
            "mixing": self.mixing,
            "compression": self.compression,
            "shared_memory": self.shared_memory,
            "parameter_transport": self._transport,
        }


def _on_cpu(value: Any) -> Any:
    """``value`` with every tensor in it copied to the CPU (dicts and lists walked)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_on_cpu(v) for v in value]
    return value


def _outer_class(name: str) -> type[Optimizer]:
    """A ``torch.optim`` optimizer class by name, any case ("sgd", "Adam", "nadam")."""
    classes = {
        n.lower(): c
        for n, c in vars(torch.optim).items()
        if isinstance(c, type) and issubclass(c, Optimizer) and c is not Optimizer
    }
    cls = classes.get(name.lower())
    if cls is None:
        raise ConfigError(
            f"diloco: no torch.optim optimizer named {name!r}; use one of {', '.join(sorted(classes))}."
        )
    return cls


def _fragments(params: Sequence[torch.Tensor], count: int) -> list[list[int]]:
    """Split parameter indices into ``count`` contiguous, roughly byte-balanced pieces."""
    sizes = [p.numel() for p in params]
    total = sum(sizes)
    groups: list[list[int]] = [[] for _ in range(count)]
    seen = 0
    for i, size in enumerate(sizes):
        # the fragment whose share of the bytes this tensor's middle falls in
        fragment = min(count - 1, int((seen + size / 2) * count / max(total, 1)))
        groups[fragment].append(i)
        seen += size
    if any(not g for g in groups):
        raise ConfigError(
            f"diloco: the model has {len(params)} parameter tensors, too few or too uneven to "
            f"split into {count} fragments; use fewer fragments."
        )
    return groups
