"""One optimizer step made of micro-batches, under a precision, with clipping.

``fit``'s loop uses :class:`Stepper` whenever a job asks for more than the plain step
(``accumulate > 1``, mixed precision, ``clip_grad_norm``, a loss the model computes); the
plain one stays inline in the loop, so a default job does no extra work per step.

Accumulating N micro-batches, each loss is scaled by 1/N, so the added-up gradient is the
mean gradient of the N batches (the gradient of one batch N times as large when the batches
are equally long). Under DDP (``allreduce``) the first N-1 backward passes run in
``no_sync()``, so gradients are all-reduced once per optimizer step, not once per batch.
Strategies that act on optimizer steps (``average``'s period, DiLoCo's inner steps, the
asynchronous ``push_every``) count optimizer steps: their hook runs after ``optimizer.step()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch import nn

from ..config import TrainingConfig
from ..strategies.base import Strategy
from .batch import forward_loss
from .precision import Precision

T = TypeVar("T")


def with_last(items: Iterable[T]) -> Iterator[tuple[T, bool]]:
    """``(item, is_last)`` pairs: one item is read ahead."""
    it = iter(items)
    try:
        current = next(it)
    except StopIteration:
        return
    for upcoming in it:
        yield current, False
        current = upcoming
    yield current, True


class Stepper:
    """Micro-batches in, an optimizer step every ``training.accumulate`` of them (and at an epoch's last),
    gradients clipped to ``training.clip_grad_norm``."""

    def __init__(
        self,
        net: nn.Module,
        loss: Callable[..., Any],
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        strategy: Strategy,
        precision: Precision,
        training: TrainingConfig,
    ) -> None:
        self.net, self.loss, self.optimizer, self.scheduler = net, loss, optimizer, scheduler
        self.strategy, self.precision = strategy, precision
        self.accumulate, self.clip = training.accumulate, training.clip_grad_norm
        self.scaler = precision.scaler()
        no_sync = getattr(net, "no_sync", None)  # DDP's; other strategies communicate after the step
        self._no_sync: Callable[[], Any] = no_sync if callable(no_sync) else contextlib.nullcontext
        self.rows = 0
        self.batches = 0
        #: whether the last micro-batch ended with an optimizer step
        self.stepped = True

    def micro_step(self, x: Any, y: Any, rows: int, index: int, last: bool) -> torch.Tensor:
        """Forward and backward one micro-batch (``index`` counts the epoch's batches); step the
        optimizer when it completes a group or is the epoch's ``last``. Returns its (unscaled) loss."""
        n = self.accumulate
        if index % n == 0:
            self.optimizer.zero_grad(set_to_none=True)
            self.rows = self.batches = 0
        self.rows += rows
        self.batches += 1
        step = (index + 1) % n == 0 or last
        with contextlib.nullcontext() if step else self._no_sync():
            with self.precision.autocast():
                loss, _ = forward_loss(self.net, self.loss, x, y)
            scaled = loss / n if n > 1 else loss
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        if step:
            self._step()
        self.stepped = step
        return loss

    def _step(self) -> None:
        optimizer = self.optimizer
        if self.batches < self.accumulate:  # a short last group: its mean gradient, not a fraction of it
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(self.accumulate / self.batches)
        self.strategy.add_samples(self.rows)
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        if self.clip is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.clip)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()


__all__ = ["Stepper", "with_last"]
