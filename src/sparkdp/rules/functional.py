"""Pure functions behind the update rules (no state): pseudo-gradients and delay factors.

They are public so that the worker loop can compute what to push and so that tests can
check each formula of docs/algorithms.md on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ._checks import check_choice, check_int, check_number, check_staleness

STALENESS_SCALINGS = ("none", "dynsgd", "inverse")


@torch.no_grad()
def pseudo_gradient(
    pulled: Sequence[Tensor], local: Sequence[Tensor], worker_lr: float, k: int
) -> list[Tensor]:
    """The gradient-like quantity a worker pushes after ``k`` local steps (docs/algorithms.md §3).

    ``g = (w_pulled - w_local) / (worker_lr * k)``: ADAG-style normalisation by the
    window (Hermans; dist-keras ``ADAGWorker``), so the server learning rate need not be
    retuned when ``k`` changes. With a plain SGD worker (no momentum) this is exactly the
    mean of the ``k`` mini-batch gradients; with ``k = 1`` it is the gradient itself.

    Args:
        pulled: the centre parameters the worker last pulled (its starting point).
        local: the worker's parameters after ``k`` local optimizer steps.
        worker_lr: the worker optimizer's learning rate ``eta_w`` (> 0).
        k: number of local steps folded into this push (>= 1).

    Returns:
        New tensors, one per parameter.

    Examples:
        >>> import torch
        >>> pseudo_gradient([torch.tensor([1.0])], [torch.tensor([0.4])], worker_lr=0.1, k=3)
        [tensor([2.])]
    """
    lr = check_number(
        "pseudo_gradient",
        "worker_lr",
        worker_lr,
        low=0,
        low_open=True,
        hint="Pass the learning rate of the worker's own optimizer.",
    )
    steps = check_int(
        "pseudo_gradient", "k", k, low=1, hint="k is the number of local steps since the last pull."
    )
    if len(pulled) != len(local):
        raise ValueError(f"pseudo_gradient: got {len(pulled)} pulled tensors but {len(local)} local ones.")
    return [torch.sub(p.detach(), w.detach()).div_(lr * steps) for p, w in zip(pulled, local, strict=True)]


def staleness_scale(tau: int, mode: str) -> float:
    """Factor by which a push of staleness ``tau`` is scaled.

    * ``"none"``: 1 (plain ASGD / Downpour).
    * ``"dynsgd"``: ``1 / (1 + tau)`` (dist-keras ``DynSGDParameterServer``).
    * ``"inverse"``: ``1 / tau`` for ``tau > 0`` and 1 at ``tau = 0`` -- the
      staleness-aware learning rate ``alpha0 / tau`` of Zhang, Gupta, Lian, Liu (IJCAI 2016),
      docs/algorithms.md §4, with ``c = 1`` (pure asynchrony).

    Examples:
        >>> staleness_scale(4, "inverse"), staleness_scale(0, "inverse"), staleness_scale(3, "dynsgd")
        (0.25, 1.0, 0.25)
    """
    mode = check_choice("staleness_scale", "mode", mode, STALENESS_SCALINGS)
    tau = check_staleness("staleness_scale", tau)
    if mode == "dynsgd":
        return 1.0 / (1 + tau)
    if mode == "inverse" and tau > 0:
        return 1.0 / tau
    return 1.0


def momentum_for_delay(tau: int, mu0: float, lag_min: float = 0.0) -> float:
    """DDC-ASGD's per-update momentum ``mu_tau`` from the lag budget (docs/algorithms.md §7).

    ``L_tau = max(L_min, mu0 / (1 - mu0) - tau)`` and ``mu_tau = L_tau / (1 + L_tau)``:
    asynchrony already adds about ``tau`` updates of lag, so the explicit heavy-ball
    momentum only gets what is left of the single-machine budget ``mu0 / (1 - mu0)``.

    Examples:
        >>> [round(momentum_for_delay(t, 0.9), 4) for t in (0, 3, 7, 9, 20)]
        [0.9, 0.8571, 0.6667, 0.0, 0.0]
    """
    # rounded so that 0.9 / 0.1 is 9 and not 9.000000000000002 (else tau = 9 leaves 2e-15 of momentum)
    budget = round(mu0 / (1.0 - mu0), 9)
    lag = max(lag_min, budget - tau)
    if lag == budget:
        return mu0  # exactly mu0 at tau = 0, so one worker reproduces torch SGD bit for bit
    return lag / (1.0 + lag)


def delay_cap(tau: int, tau_c: float) -> float:
    """DDC-ASGD's compensation reliability ``min(1, tau_c / max(tau, 1))`` (section 7.2)."""
    return min(1.0, tau_c / max(tau, 1))


def delay_compensation(
    g: Tensor, displacement: Tensor, strength: Tensor | float, kappa: float = math.inf
) -> Tensor:
    """DC-ASGD's Taylor correction ``strength * g*g * (w_t - w_bak)``, clipped to ``[-kappa|g|, kappa|g|]``.

    With ``kappa = 1`` (DDC-ASGD default) ``g + correction`` rescales each coordinate of
    ``g`` by a factor in ``[0, 2]``: the correction can never flip the gradient's sign.
    ``kappa = inf`` is DC-ASGD's unclipped correction (Zheng et al., ICML 2017).
    """
    c = strength * (g * g) * displacement
    if math.isinf(kappa):
        return c
    bound = g.abs().mul_(kappa)
    return torch.maximum(torch.minimum(c, bound), -bound)
