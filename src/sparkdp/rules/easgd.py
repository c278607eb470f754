"""Asynchronous elastic averaging: EASGD and DeepSpark's lock-free variant (docs/algorithms.md §5)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from ._checks import as_locking, check_choice, check_int, check_number, check_push, like
from .base import Locking, Push, PushKind, UpdateRule

VARIANTS = ("async", "deepspark")


class EASGD(UpdateRule):
    """Asynchronous Elastic Averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015).

    Workers train on their own (with their own optimizer) and every exchange pulls
    worker and centre toward each other instead of overwriting the worker.

    ``variant="async"`` (paper Alg. 1): ``e = alpha * (x_i - x_centre)``, the worker moves
    ``x_i -= e`` and pushes ``e``, the server does ``x_centre += e``; ``merge`` is a no-op
    since the worker already moved. ``variant="deepspark"`` (lock-free): the worker pushes
    its full weights, ``x_i <- (1 - alpha) x_i + alpha x_centre_old``, and the server does
    ``x_centre <- (1 - alpha_s) x_centre + alpha_s x_i``. See docs/algorithms.md §5.

    Args:
        alpha: moving rate in (0, 1). Default ``0.9 / num_workers`` for ``"async"`` (the
            paper's ``beta = p * alpha = 0.9``) and 0.1 for ``"deepspark"``. Lower it if
            workers are dragged together so hard that they stop exploring (dist-keras saw
            this with small communication periods and many workers); raise it if the
            centre lags far behind the workers (centre loss much worse than workers').
        num_workers: number of workers ``p``; needed for the async default of ``alpha``.
        variant: ``"async"`` or ``"deepspark"``.
        server_factor: deepspark only: ``alpha_s = alpha * server_factor`` (in (0, 1]).
        locking: default ``Locking.GLOBAL`` for ``"async"``, ``Locking.NONE`` for
            ``"deepspark"`` (races may lose a server update; each exchange is small).

    Examples:
        >>> import torch
        >>> rule = EASGD(num_workers=2)  # alpha = 0.45
        >>> x, centre = [torch.tensor([2.0])], [torch.tensor([0.0])]
        >>> e = rule.make_push(x, centre, grads=[])
        >>> rule.apply(centre, Push(worker=0, staleness=0, tensors=tuple(e)))
        >>> x[0], centre[0]
        (tensor([1.1000]), tensor([0.9000]))
    """

    pushes = PushKind.ELASTIC

    def __init__(
        self,
        *,
        alpha: float | None = None,
        num_workers: int | None = None,
        variant: str = "async",
        server_factor: float = 1.0,
        locking: Locking | str | None = None,
    ) -> None:
        self.variant = check_choice("EASGD", "variant", variant, VARIANTS)
        if num_workers is not None:
            check_int("EASGD", "num_workers", num_workers, low=1)
        self.num_workers = num_workers
        if alpha is None:
            if self.variant == "deepspark":
                alpha = 0.1  # DeepSpark's moving_rate default
            elif num_workers is None:
                raise ConfigError(
                    "EASGD: pass num_workers= (alpha defaults to 0.9 / num_workers, as in Zhang et al. 2015) "
                    "or alpha= explicitly."
                )
            else:
                alpha = 0.9 / num_workers
        self.alpha = check_number(
            "EASGD",
            "alpha",
            alpha,
            low=0,
            high=1,
            low_open=True,
            high_open=True,
            hint="alpha is the elastic moving rate; the paper uses 0.9 / num_workers.",
        )
        if self.variant == "async" and server_factor != 1.0:
            raise ConfigError(
                f"EASGD: server_factor applies only to variant='deepspark'; got {server_factor!r}."
            )
        self.server_alpha = check_number(
            "EASGD",
            "alpha * server_factor",
            self.alpha * server_factor,
            low=0,
            high=1,
            low_open=True,
            hint="Lower server_factor so the server's moving rate stays at most 1.",
        )
        default = Locking.NONE if self.variant == "deepspark" else Locking.GLOBAL
        self.locking = default if locking is None else as_locking("EASGD", locking)

    @torch.no_grad()
    def make_push(
        self, local: Sequence[Tensor], pulled: Sequence[Tensor], grads: Sequence[Tensor]
    ) -> list[Tensor]:
        """Move the worker toward the pulled centre and return what the server needs."""
        if len(local) != len(pulled):
            raise ValueError(f"EASGD: {len(local)} local tensors but {len(pulled)} pulled ones.")
        out = []
        for x, c in zip(local, pulled, strict=True):
            c = like(c, x)
            if self.variant == "async":
                e = (x - c).mul_(self.alpha)  # computed before the worker moves (paper Alg. 1)
                x.sub_(e)
                out.append(e)
            else:
                out.append(x.detach().clone())  # pre-move weights, as DeepSpark sends them
                x.lerp_(c, self.alpha)  # x <- (1 - alpha) x + alpha * centre_old
        return out

    def merge(self, local: Sequence[Tensor], center: Sequence[Tensor]) -> None:
        """No-op: the elastic move already happened in :meth:`make_push`."""

    @torch.no_grad()
    def apply(self, center: Sequence[Tensor], push: Push) -> None:
        """``x_centre += e`` (async) or ``x_centre <- lerp(x_centre, x_i, alpha_s)`` (deepspark)."""
        check_push("EASGD", center, push)
        for c, t in zip(center, push.tensors, strict=True):
            if self.variant == "async":
                c.add_(like(t, c))
            else:
                c.lerp_(like(t, c), self.server_alpha)

    # No server state beyond the centre: state_dict()/load_state_dict() keep the base no-ops.
