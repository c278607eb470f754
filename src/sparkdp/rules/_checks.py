"""Validation and small tensor helpers shared by the update rules (design rule 4, docs/architecture.md).

Every check raises :class:`~sparkdp.errors.ConfigError` (a ``ValueError``) whose message
says what was received, what is allowed and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError
from .base import Locking, Push


def check_number(
    owner: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> float:
    """Return ``value`` as a float if it lies in the interval, else raise ConfigError."""
    lo_txt = "-inf" if low is None else f"{low:g}"
    hi_txt = "inf" if high is None else f"{high:g}"
    interval = f"{'(' if low_open or low is None else '['}{lo_txt}, {hi_txt}{')' if high_open or high is None else ']'}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"{owner}: `{name}` must be a real number in {interval}; got {value!r}. {hint}".rstrip()
        )
    v = float(value)
    ok = not math.isnan(v)
    if ok and low is not None:
        ok = v > low if low_open else v >= low
    if ok and high is not None:
        ok = v < high if high_open else v <= high
    if not ok:
        raise ConfigError(f"{owner}: `{name}` must be in {interval}; got {value!r}. {hint}".rstrip())
    return v


def check_int(owner: str, name: str, value: Any, *, low: int, hint: str = "") -> int:
    """Return ``value`` if it is an int >= ``low``, else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{owner}: `{name}` must be an integer >= {low}; got {value!r}. {hint}".rstrip())
    return value


def check_choice(owner: str, name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` lower-cased if it is one of ``choices``, else raise ConfigError."""
    options = list(choices)
    key = value.lower() if isinstance(value, str) else value
    if key not in options:
        raise ConfigError(f"{owner}: `{name}` must be one of {', '.join(map(repr, options))}; got {value!r}.")
    return key


def as_locking(owner: str, value: Locking | str) -> Locking:
    """Accept a :class:`Locking` or its string value (``"none"``/``"global"``)."""
    if isinstance(value, Locking):
        return value
    if isinstance(value, str):
        for member in Locking:
            if value.lower() in (member.value, member.name.lower()):
                return member
    allowed = ", ".join(repr(m.value) for m in Locking)
    raise ConfigError(
        f"{owner}: `locking` must be a sparkdp.rules.Locking or one of {allowed}; got {value!r}."
    )


def check_staleness(owner: str, tau: Any) -> int:
    """The server's staleness must be a non-negative int (docs/algorithms.md §0)."""
    if isinstance(tau, bool) or not isinstance(tau, int) or tau < 0:
        raise ValueError(
            f"{owner}: push staleness must be an integer >= 0 (server version minus pulled version); got {tau!r}."
        )
    return tau


def check_push(owner: str, center: Sequence[Tensor], push: Push) -> None:
    """A push must carry one tensor per centre tensor of this shard, shape for shape."""
    if len(push.tensors) != len(center):
        raise ValueError(
            f"{owner}: push from worker {push.worker} has {len(push.tensors)} tensors but this shard has "
            f"{len(center)}; the worker and the server must shard the parameters the same way."
        )
    for i, (c, g) in enumerate(zip(center, push.tensors, strict=True)):
        if c.shape != g.shape:
            raise ValueError(
                f"{owner}: push from worker {push.worker}, tensor {i}: shape {tuple(g.shape)} does not match the "
                f"centre's {tuple(c.shape)}."
            )


def like(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` on ``ref``'s dtype and device (no copy when they already match)."""
    return t.to(device=ref.device, dtype=ref.dtype)


class Slots:
    """Lazily created per-key, per-tensor-index state of one shard.

    The key is a worker id for per-worker state (DC-ASGD backups, mean squares) or 0
    for state shared by all workers (momentum). The index is the position of the tensor
    in the shard, which is stable because the server always passes its shard in order.
    """

    def __init__(self) -> None:
        self._d: dict[Hashable, dict[int, Tensor]] = {}

    def get(self, key: Hashable, i: int) -> Tensor | None:
        return self._d.get(key, {}).get(i)

    def put(self, key: Hashable, i: int, t: Tensor) -> Tensor:
        self._d.setdefault(key, {})[i] = t
        return t

    def zeros(self, key: Hashable, i: int, ref: Tensor) -> Tensor:
        t = self.get(key, i)
        return t if t is not None else self.put(key, i, torch.zeros_like(ref))

    def store(self, key: Hashable, tensors: Sequence[Tensor]) -> None:
        """Copy ``tensors`` into the slots of ``key``, reusing buffers (no realloc per pull)."""
        for i, src in enumerate(tensors):
            dst = self.get(key, i)
            if (
                dst is not None
                and dst.shape == src.shape
                and dst.dtype == src.dtype
                and dst.device == src.device
            ):
                dst.copy_(src)
            else:
                self.put(key, i, src.detach().clone())

    def state_dict(self) -> dict[Any, dict[int, Tensor]]:
        # clones, so that a checkpoint is a snapshot and not a view of live buffers
        return {k: {i: t.clone() for i, t in v.items()} for k, v in self._d.items()}

    def load_state_dict(self, state: dict[Any, dict[Any, Tensor]]) -> None:
        # keys may come back as strings from formats with string-only keys
        self._d = {
            int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k: {
                int(i): t.clone() for i, t in v.items()
            }
            for k, v in state.items()
        }
