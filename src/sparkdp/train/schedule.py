"""Named learning-rate schedules over a job's optimizer steps (``lr_schedule=``).

``warmup-cosine``: the k-th optimizer step of T (k = 0 .. T-1) uses

* ``lr * (k + 1) / (W + 1)`` while ``k < W`` (linear warmup over ``W = warmup_steps``; never 0), then
* ``lr * (r + (1 - r) * (1 + cos(pi * (k - W) / (T - 1 - W))) / 2)``: a cosine from the
  optimizer's ``lr`` at step W down to ``r * lr`` (``r = min_lr_ratio``) at the last step.

The schedule is a ``torch.optim.lr_scheduler.LambdaLR`` over a small callable object, so its
state (step count, and the object's own numbers) travels in checkpoints with the optimizer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from ..config import TrainingConfig
from ..errors import ConfigError


@dataclass
class WarmupCosine:
    """The lr multiplier of optimizer step ``k`` (see the module docstring)."""

    warmup_steps: int
    total_steps: int
    min_lr_ratio: float = 0.0

    def __call__(self, k: int) -> float:
        if k < self.warmup_steps:
            return (k + 1) / (self.warmup_steps + 1)
        span = max(1, self.total_steps - 1 - self.warmup_steps)
        progress = min(1.0, (k - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_schedule(training: TrainingConfig, optimizer: Optimizer, total_steps: int | None) -> LambdaLR:
    """The schedule ``training.lr_schedule`` names (not "constant"), over the job's ``total_steps``
    optimizer steps; built in every worker once they are known."""
    if total_steps is None:
        raise unknown_length(training.lr_schedule)
    if training.warmup_steps >= total_steps:
        raise ConfigError(
            f"warmup_steps ({training.warmup_steps}) must be fewer than the job's {total_steps} "
            "optimizer steps (epochs x steps per epoch / accumulate)."
        )
    return LambdaLR(optimizer, WarmupCosine(training.warmup_steps, total_steps, float(training.min_lr_ratio)))


def unknown_length(name: str) -> ConfigError:
    return ConfigError(
        f"lr_schedule={name!r} needs the job's number of optimizer steps, which needs the "
        "training data's row count; this data does not say it (a streamed DataFrame). Write it "
        "to Parquet, or pass lr_scheduler=optimizer -> scheduler."
    )


__all__ = ["WarmupCosine", "lr_schedule", "unknown_length"]
