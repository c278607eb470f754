"""DDC-ASGD: dynamic delay-compensated ASGD, this project's formulation (docs/algorithms.md, DDC-ASGD)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from ._checks import check_number, check_push, check_staleness, like
from .base import Push, PushKind
from .dcasgd import ALL, DelayCompensatedRule
from .functional import delay_cap, delay_compensation, momentum_for_delay


class DDCASGD(DelayCompensatedRule):
    """Dynamic delay-compensated ASGD: DC-ASGD-a whose momentum and correction depend on each push's delay.

    Per push of staleness ``tau`` from worker ``m`` (docs/algorithms.md §7.1)::

        V    <- beta*V + (1 - beta) g*g
        lam  = lambda_ * min(1, tau_c / max(tau, 1)) / sqrt(V + eps)
        c    = clip(lam * g*g * (w - w_bak(m)), -kappa|g|, +kappa|g|)
        mu   = L / (1 + L),  L = max(lag_min, momentum / (1 - momentum) - tau)
        u    <- mu*u + (g + c);   w <- w - lr*u

    Why each piece, the defaults and the reductions (one worker is momentum SGD;
    ``momentum = 0, tau_c = kappa = inf`` is DC-ASGD-a): see docs/algorithms.md §7.1-7.2.
    Workers push **raw gradients** (``pushes = PushKind.GRADIENT``) whatever their own
    optimizer: fed a momentum worker's pseudo-gradient the two momenta compound and training
    diverges (docs/algorithms.md §7.3).

    Args:
        lr: server learning rate (> 0), the ``eta`` of momentum SGD that one worker reproduces.
            Default 0.02, chosen on measurements (docs/algorithms.md §7.2): lower it if the
            loss spikes early.
        momentum: ``mu_0`` in [0, 1), the single-machine momentum (default 0.9).
        lag_min: ``L_min`` >= 0 (default 0): the least lag left to explicit momentum. Raise
            it (e.g. 1-3) only if very stale updates need some smoothing.
        lambda_: ``lambda_0`` >= 0 (default 2.0): delay-compensation strength.
        mean_square_decay: ``beta`` in [0, 1) (default 0.95).
        eps: ``epsilon`` > 0 (default 1e-7).
        tau_c: delay up to which compensation is applied in full (default ``num_workers``,
            since the typical delay is ``num_workers - 1``). Lower it if stragglers still
            cause loss spikes; ``inf`` never caps.
        kappa: trust-region factor > 0 of the element-wise clip (default 1; ``inf`` disables).
        num_workers: number of workers; needed for the default ``tau_c``.
        per_worker_mean_square: keep one ``V`` per worker (Multiverso's DC-ASGD-a) instead
            of one shared ``V`` (default False: a shared ``V`` warms up faster, costs ``S``
            instead of ``M*S``).

    Examples:
        >>> import torch
        >>> rule = DDCASGD(lr=0.1, num_workers=4)
        >>> w = [torch.tensor([1.0])]
        >>> rule.on_pull(0, w)
        >>> rule.apply(w, Push(worker=0, staleness=0, tensors=(torch.tensor([1.0]),)))
        >>> w[0]
        tensor([0.9000])
    """

    pushes = PushKind.GRADIENT

    def __init__(
        self,
        *,
        lr: float = 0.02,
        momentum: float = 0.9,
        lag_min: float = 0.0,
        lambda_: float = 2.0,
        mean_square_decay: float = 0.95,
        eps: float = 1e-7,
        tau_c: float | None = None,
        kappa: float = 1.0,
        num_workers: int | None = None,
        per_worker_mean_square: bool = False,
    ) -> None:
        super().__init__(lr, momentum, lambda_, mean_square_decay, eps, num_workers)
        self.lag_min = check_number(
            "DDCASGD",
            "lag_min",
            lag_min,
            low=0,
            high=1e9,
            hint="lag_min is a number of updates; 0 is the default.",
        )
        if self.lambda_ == 0:
            warnings.warn(
                "DDCASGD with lambda_=0 applies no delay compensation (only the delay-dependent "
                "momentum); use a positive lambda_ for DC.",
                UserWarning,
                stacklevel=2,
            )
        if tau_c is None:
            if num_workers is None:
                raise ConfigError(
                    "DDCASGD: pass num_workers= (tau_c defaults to the number of workers) or tau_c=."
                )
            tau_c = num_workers
        self.tau_c = check_number(
            "DDCASGD",
            "tau_c",
            tau_c,
            low=0,
            low_open=True,
            hint="tau_c is a delay in server updates; default num_workers, inf disables the cap.",
        )
        self.kappa = check_number(
            "DDCASGD",
            "kappa",
            kappa,
            low=0,
            low_open=True,
            hint="kappa=1 lets compensation scale g by [0, 2]; inf disables the clip.",
        )
        self.per_worker_mean_square = bool(per_worker_mean_square)
        # the buffer is needed whenever some delay can get mu > 0
        self._use_buffer = self.momentum > 0 or self.lag_min > 0

    @torch.no_grad()
    def apply(self, center: Sequence[Tensor], push: Push) -> None:
        """One DDC-ASGD server update (section 7.2) with ``tau = push.staleness``."""
        check_push("DDCASGD", center, push)
        tau = check_staleness("DDCASGD", push.staleness)
        mu = momentum_for_delay(tau, self.momentum, self.lag_min)
        cap = delay_cap(tau, self.tau_c) * self.lambda_
        key = push.worker if self.per_worker_mean_square else ALL
        beta = self.mean_square_decay
        for i, (w, g) in enumerate(zip(center, push.tensors, strict=True)):
            g = like(g, w)
            v = self._mean_square.zeros(key, i, g)
            v.mul_(beta).add_(g * g, alpha=1 - beta)
            displacement = self._displacement(push.worker, i, w) if cap != 0 else None
            if displacement is None:
                d = g
            else:
                strength = cap / torch.sqrt(v + self.eps)
                d = g + delay_compensation(g, displacement, strength, self.kappa)
            self._step(i, w, d, mu, self._use_buffer)
