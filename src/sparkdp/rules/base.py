"""The update-rule interface: how a worker's contribution meets the centre variable.

Rules are pure tensor math: no sockets, threads, pickle or pyspark (design rule 1, docs/architecture.md).
The parameter server (``sparkdp.ps``) owns the centre tensors, the version counter
and the locking, and calls these hooks; the async worker loop
(``sparkdp.strategies``) calls the worker-side hooks.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


class Locking(enum.Enum):
    """What concurrency control a rule needs around :meth:`UpdateRule.apply`."""

    NONE = "none"  # Hogwild!: lock-free, lost updates accepted by design
    GLOBAL = "global"  # one lock around each apply (per shard)


class PushKind(enum.Enum):
    """What a worker sends to the server, declared by each rule (:attr:`UpdateRule.pushes`).

    The worker loop reads this instead of guessing from a rule's class.
    """

    #: ``(w_pulled - w_local) / (lr_w * k)`` after ``k`` steps of the worker's own optimizer
    #: (ADAG normalisation, docs/algorithms.md): the worker optimizer shapes the update, so a
    #: momentum worker pushes its momentum-smoothed step. The ASGD family and DC-ASGD.
    PSEUDO_GRADIENT = "pseudo_gradient"
    #: the mean of the raw mini-batch gradients of the ``k`` local steps. For rules that apply
    #: their own momentum (and Taylor correction) to gradients: a pseudo-gradient from a momentum
    #: worker would get momentum twice (DDC-ASGD diverged that way: the CNN stayed at chance).
    GRADIENT = "gradient"
    #: ``make_push(local, centre)`` right after a fresh pull; the rule moves the worker itself
    #: (``merge`` is then not used). EASGD.
    ELASTIC = "elastic"


@dataclass(frozen=True)
class Push:
    """One worker contribution as the server sees it.

    Attributes:
        worker: the pushing worker's id (0..num_workers-1).
        staleness: tau = server version when the push is applied minus the version
            the worker last pulled (docs/algorithms.md §0); filled in by the server.
        tensors: the pushed tensors, one per centre tensor (of this shard), in order.
        num_samples: training samples behind this push (for weighting / metrics).
        local_steps: k, the number of local mini-batches folded into this push.
    """

    worker: int
    staleness: int
    tensors: tuple[Tensor, ...]
    num_samples: int = 1
    local_steps: int = 1


class UpdateRule(ABC):
    """How one worker's contribution is folded into the centre variable (and back).

    Subclasses implement :meth:`apply`; the other hooks have ASGD defaults.
    A rule instance lives on the server for one shard of the parameters (the
    server creates one per shard through a factory) and, separately, on each
    worker for the worker-side hooks; it must therefore never assume it sees the
    whole model on the server side.
    """

    #: Concurrency requirement honoured by the parameter server.
    locking: Locking = Locking.GLOBAL
    #: What the worker pushes (honoured by the async worker loop).
    pushes: PushKind = PushKind.PSEUDO_GRADIENT

    # --- worker side (runs in the Spark task) ---------------------------------------
    def make_push(
        self, local: Sequence[Tensor], pulled: Sequence[Tensor], grads: Sequence[Tensor]
    ) -> list[Tensor]:
        """Return what this worker sends. Default: its (pseudo-)gradients."""
        return list(grads)

    def merge(self, local: Sequence[Tensor], center: Sequence[Tensor]) -> None:
        """Fold a freshly pulled centre into the local parameters. Default: overwrite."""
        with torch.no_grad():  # local tensors are usually model parameters that require grad
            for dst, src in zip(local, center, strict=False):
                dst.copy_(src)

    # --- server side (runs in the parameter server, under ``locking``) ---------------
    @abstractmethod
    def apply(self, center: Sequence[Tensor], push: Push) -> None:
        """Update ``center`` in place with ``push``."""

    def on_pull(self, worker: int, center: Sequence[Tensor]) -> None:  # noqa: B027 (optional hook)
        """Called (under the same lock as apply) when ``worker`` pulls. Default: no-op."""

    def state_dict(self) -> dict[str, Any]:
        """Rule state for checkpoints (tensors and plain Python values only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore what :meth:`state_dict` returned."""
