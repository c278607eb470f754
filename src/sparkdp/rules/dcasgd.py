"""DC-ASGD: delay-compensated asynchronous SGD (Zheng et al., ICML 2017; docs/algorithms.md §6)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ._checks import Slots, check_choice, check_int, check_number, check_push, like
from .base import Locking, Push, UpdateRule
from .functional import delay_compensation

ALL = "all"  # Slots key of state shared by every worker (momentum, a global mean square)


class DelayCompensatedRule(UpdateRule):
    """Bookkeeping shared by DC-ASGD and DDC-ASGD: per-worker backups and a heavy-ball step.

    ``on_pull`` snapshots the centre as the pulling worker's backup ``w_bak(m)``; a push is
    then compensated with the displacement ``w_t - w_bak(m)``. A worker that pushes
    without ever having pulled (the parameter server does not let that happen) gets no
    compensation, i.e. its push is treated as fresh.
    """

    locking = Locking.GLOBAL  # per-worker state and momentum are read-modify-write

    def __init__(
        self,
        lr: float,
        momentum: float,
        lambda_: float,
        mean_square_decay: float,
        eps: float,
        num_workers: int | None,
    ) -> None:
        name = type(self).__name__
        self.lr = check_number(
            name,
            "lr",
            lr,
            low=0,
            low_open=True,
            hint="lr is the server learning rate (the single-machine LR of momentum SGD).",
        )
        self.momentum = check_number(
            name,
            "momentum",
            momentum,
            low=0,
            high=1,
            high_open=True,
            hint="0.9 is the usual single-machine value; 0 disables momentum.",
        )
        self.lambda_ = check_number(
            name,
            "lambda_",
            lambda_,
            low=0,
            hint="lambda_ scales the delay compensation: 2.0 (DC-ASGD-a), 0.04 (-c).",
        )
        self.mean_square_decay = check_number(
            name,
            "mean_square_decay",
            mean_square_decay,
            low=0,
            high=1,
            high_open=True,
            hint="0.95 is DC-ASGD's value.",
        )
        self.eps = check_number(name, "eps", eps, low=0, low_open=True, hint="1e-7 is DC-ASGD's value.")
        if num_workers is not None:
            check_int(name, "num_workers", num_workers, low=1)
        self._backup = Slots()  # worker -> index -> w_bak(m)
        self._mean_square = Slots()  # worker (or ALL) -> index -> MeanSquare
        self._buffer = Slots()  # ALL -> index -> heavy-ball buffer u

    @torch.no_grad()
    def on_pull(self, worker: int, center: Sequence[Tensor]) -> None:
        """``w_bak(worker) <- w_t`` (copied; buffers are reused across pulls)."""
        self._backup.store(worker, center)

    def _displacement(self, worker: int, i: int, w: Tensor) -> Tensor | None:
        bak = self._backup.get(worker, i)
        return None if bak is None else w - bak

    def _step(self, i: int, w: Tensor, d: Tensor, mu: float, use_buffer: bool) -> None:
        """Heavy-ball ``u <- mu*u + d; w <- w - lr*u``, written exactly as torch.optim.SGD does it."""
        if not use_buffer:
            w.add_(d, alpha=-self.lr)
            return
        buf = self._buffer.get(ALL, i)
        if buf is None:
            buf = self._buffer.put(ALL, i, d.detach().clone())  # torch SGD's first step: u = d
        else:
            buf.mul_(mu).add_(d)
        w.add_(buf, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        """Backups, mean squares and momentum buffers (copies), keyed worker -> tensor index."""
        return {
            "backup": self._backup.state_dict(),
            "mean_square": self._mean_square.state_dict(),
            "momentum_buffer": self._buffer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._backup.load_state_dict(state.get("backup", {}))
        self._mean_square.load_state_dict(state.get("mean_square", {}))
        self._buffer.load_state_dict(state.get("momentum_buffer", {}))


class DCASGD(DelayCompensatedRule):
    """DC-ASGD: ``w <- w - lr * (g + lambda_t * g*g * (w - w_bak(m)))`` (Zheng et al., ICML 2017).

    The Taylor correction toward the current centre: see docs/algorithms.md §6. Backups
    ``w_bak(m)`` are per worker, not per parameter as in MXNet's ``DCASGD``.

    Args:
        lr: server learning rate (> 0); workers push raw gradients or pseudo-gradients.
        variant: ``"a"`` (adaptive, default): ``lambda_t = lambda_ / sqrt(MeanSquare + eps)``
            with a per-worker ``MeanSquare <- m*MeanSquare + (1-m) g*g``; ``"c"``:
            constant ``lambda_t = lambda_``.
        lambda_: variance control ``lambda_0`` (>= 0). Default 2.0 for ``"a"`` (paper's
            CIFAR-10 value) and 0.04 for ``"c"`` (MXNet). 0 is plain ASGD. Lower it, or use
            ``"ddcasgd"`` (which clips the correction), if the loss spikes when slow
            workers push (DC-ASGD-a's ``lambda_ / sqrt(V)`` is large while ``V`` is still small; docs/algorithms.md §7.1).
        mean_square_decay: ``m`` of the mean square, in [0, 1) (default 0.95; ``"a"`` only).
        eps: ``epsilon`` under the square root (> 0, default 1e-7).
        momentum: heavy-ball momentum in [0, 1) (default 0): ``u <- momentum*u + d;
            w <- w - lr*u`` (MXNet ``DCASGD(momentum>0)``, with per-worker backups). A
            fixed momentum adds to asynchrony's own: it degrades as workers are added.
        num_workers: unused; accepted so that callers can pass it to every rule.

    Examples:
        >>> import torch
        >>> rule = DCASGD(lr=0.1, variant="c", lambda_=0.04)
        >>> rule.on_pull(0, [torch.tensor([0.5])])  # the worker computed g at 0.5
        >>> w = [torch.tensor([1.0])]  # ... but the centre has moved on since
        >>> rule.apply(w, Push(worker=0, staleness=3, tensors=(torch.tensor([2.0]),)))
        >>> round(w[0].item(), 4)  # 1 - 0.1 * (2 + 0.04 * 4 * 0.5)
        0.792
    """

    def __init__(
        self,
        *,
        lr: float = 0.01,
        variant: str = "a",
        lambda_: float | None = None,
        mean_square_decay: float = 0.95,
        eps: float = 1e-7,
        momentum: float = 0.0,
        num_workers: int | None = None,
    ) -> None:
        variant = check_choice("DCASGD", "variant", variant, ("a", "c"))
        if lambda_ is None:
            lambda_ = 2.0 if variant == "a" else 0.04
        super().__init__(lr, momentum, lambda_, mean_square_decay, eps, num_workers)
        self.variant = variant
        if self.lambda_ == 0:
            warnings.warn(
                "DCASGD with lambda_=0 is equivalent to ASGD (no delay compensation); "
                "use rule 'asgd' or a positive lambda_.",
                UserWarning,
                stacklevel=2,
            )

    @torch.no_grad()
    def apply(self, center: Sequence[Tensor], push: Push) -> None:
        """Compensate the push with its worker's backup, then take the (heavy-ball) SGD step."""
        check_push("DCASGD", center, push)
        m = self.mean_square_decay
        for i, (w, g) in enumerate(zip(center, push.tensors, strict=True)):
            g = like(g, w)
            strength: Tensor | float = self.lambda_
            if self.variant == "a":
                ms = self._mean_square.zeros(push.worker, i, g)
                ms.mul_(m).add_(g * g, alpha=1 - m)
                strength = self.lambda_ / torch.sqrt(ms + self.eps)
            displacement = self._displacement(push.worker, i, w) if self.lambda_ != 0 else None
            d = g if displacement is None else g + delay_compensation(g, displacement, strength)
            self._step(i, w, d, self.momentum, use_buffer=self.momentum > 0)
