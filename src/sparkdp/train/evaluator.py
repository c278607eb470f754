"""Test metrics: over every rank's share of the evaluation data, each row counted once, and the
worker's evaluator, which computes them after the epochs the job evaluates after."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..comm.base import Collective
from ..data.base import WorkerData
from ..errors import ConfigError
from ..strategies.base import Strategy
from .batch import ModelLoss, batch_rows, forward_loss, to_device
from .batch_check import class_scores
from .layout import batch_layout

if TYPE_CHECKING:
    from .spec import FitSpec


def evaluate(
    model: nn.Module,
    loss_fn: Callable,
    data: WorkerData,
    collective: Collective,
    batch_size: int,
    channels_last: bool = False,
    *,
    metric: Callable[[Any, Any], Any] | None = None,
    metric_names: tuple[str, ...] = (),
    autocast: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Loss and (for classifiers) accuracy over all ranks' shares, each row counted once.

    A model that computes its own loss over label tokens (``loss="model"``, dict batches with
    ``labels``) reports the token-mean loss and its ``exp``, the perplexity. ``metric(outputs,
    batch)`` returns ``{name: value}`` (a batch mean, weighted by the batch's rows) or
    ``{name: (sum, count)}`` per batch; each is reported as the sum over all batches of all
    ranks divided by the count."""
    model.eval()
    device = next(model.parameters(), torch.empty(0)).device  # a GPU worker's model, or the CPU
    # loss*rows, correct, rows, rows with one output tensor, loss*tokens, tokens, then per metric: sum, count
    sums = torch.zeros(6 + 2 * len(metric_names), dtype=torch.float64)
    plain = not isinstance(loss_fn, ModelLoss) and metric is None and autocast is None
    with torch.no_grad():
        for x, y in data.eval_batches(
            rank=collective.rank, world_size=collective.world_size, batch_size=batch_size
        ):
            rows = batch_rows(x)
            if plain and isinstance(x, torch.Tensor):
                x, y = x.to(device), y.to(device)
                out = model(batch_layout(x, channels_last))
                loss = loss_fn(out, y)
            else:
                x, y = to_device(x, device), to_device(y, device)
                with autocast() if autocast is not None else contextlib.nullcontext():
                    loss, out = forward_loss(
                        model,
                        loss_fn,
                        batch_layout(x, channels_last) if isinstance(x, torch.Tensor) else x,
                        y,
                    )
                tokens = loss_fn.tokens(x) if isinstance(loss_fn, ModelLoss) else None
                if tokens is not None:
                    sums[4] += float(loss) * tokens
                    sums[5] += tokens
                if metric is not None:
                    _add_metrics(sums[6:], metric(out, x if y is None else (x, y)), metric_names, rows)
            sums[0] += float(loss) * rows
            if class_scores(out, y):
                sums[1] += float((out.argmax(1) == y).sum())
            sums[2] += rows
            sums[3] += rows if isinstance(out, torch.Tensor) else 0
    collective.all_reduce(sums, "sum")
    model.train()
    rows_total = max(sums[2].item(), 1.0)
    metrics = {"test_loss": sums[0].item() / rows_total}
    if sums[3] > 0:  # not for models returning several tensors (a Siamese net's pair of features)
        metrics["test_accuracy"] = sums[1].item() / rows_total
    if sums[5] > 0:  # a language model's loss per label token, and its perplexity
        metrics["test_loss"] = sums[4].item() / sums[5].item()
        metrics["test_perplexity"] = math.exp(metrics["test_loss"])
    for i, name in enumerate(metric_names):
        total, count = sums[6 + 2 * i].item(), sums[7 + 2 * i].item()
        metrics[f"test_{name}"] = total / count if count else math.nan
    return metrics


def _add_metrics(sums: torch.Tensor, values: Any, names: tuple[str, ...], rows: int) -> None:
    """Add one batch's ``metric`` result to ``sums`` (sum, count per name)."""
    if not isinstance(values, dict) or set(values) != set(names):
        got = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise ConfigError(
            f"the metric function must return the same names for every batch, {list(names)}; got {got}."
        )
    for i, name in enumerate(names):
        value = values[name]
        total, count = value if isinstance(value, (tuple, list)) else (float(value) * rows, rows)
        sums[2 * i] += float(total)
        sums[2 * i + 1] += float(count)


def metric_names(metric: Callable[[Any, Any], Any], out: Any, x: Any, y: Any) -> tuple[str, ...]:
    """The names ``metric`` returns for one batch (run on the driver), checked."""
    values = metric(out, x if y is None else (x, y))
    if not isinstance(values, dict) or not values or not all(isinstance(k, str) for k in values):
        raise ConfigError(
            f"metric must return a dict of name -> value (a batch mean) or (sum, count); got {values!r}."
        )
    for name, value in values.items():
        pair = isinstance(value, (tuple, list))
        if (pair and len(value) != 2) or not all(
            isinstance(v, (int, float)) or (isinstance(v, torch.Tensor) and v.numel() == 1)
            for v in (value if pair else (value,))
        ):
            raise ConfigError(f"metric's {name!r} must be a number or a (sum, count) pair; got {value!r}.")
    return tuple(sorted(values))


class Evaluator:
    """A worker's test metrics after an epoch: of the model and over the collective its strategy
    names (``Strategy.evaluation``: an averaging strategy evaluates the ranks' average), in the
    memory layout and precision the worker trains in."""

    def __init__(self, spec: FitSpec, channels_last: bool, autocast: Callable[[], Any] | None) -> None:
        self.spec, self.channels_last, self.autocast = spec, channels_last, autocast

    def after(self, epoch: int, strategy: Strategy, collective: Collective) -> dict[str, float]:
        """The test metrics after ``epoch`` (0-based); none where the job does not evaluate then."""
        spec = self.spec
        if not spec.evaluates_after(epoch):
            return {}
        target = strategy.evaluation(collective, last=epoch == spec.last_epoch())
        if target is None:
            return {}
        assert spec.eval is not None  # evaluates_after(epoch) holds only with evaluation data
        return evaluate(
            target[0],
            spec.loss,
            spec.eval,
            target[1],
            spec.eval_batch_size,
            self.channels_last,
            metric=spec.metric,
            metric_names=spec.metric_names,
            autocast=self.autocast,
        )


__all__ = ["Evaluator", "evaluate", "metric_names"]
