"""ASGD / Downpour SGD, Hogwild! and staleness-scaled variants: a server optimizer on each push."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor
from torch.optim import Optimizer

from ..errors import ConfigError
from ._checks import as_locking, check_choice, check_int, check_number, check_push, like
from .base import Locking, Push, UpdateRule
from .functional import STALENESS_SCALINGS, staleness_scale

OptimizerFactory = Callable[[list[torch.nn.Parameter]], Optimizer]


def server_optimizers() -> dict[str, type[Optimizer]]:
    """Every ``torch.optim`` optimizer usable by name as ``server_optimizer`` (lower-cased)."""
    out = {}
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        # LBFGS needs a closure that re-evaluates the loss; the server has no loss
        if isinstance(cls, type) and issubclass(cls, Optimizer) and cls not in (Optimizer, torch.optim.LBFGS):
            out[name.lower()] = cls
    return out


class ASGD(UpdateRule):
    """Asynchronous SGD / Downpour: each push is one step of a server-side optimizer.

    The worker trains with its own ``torch.optim`` optimizer and pushes a
    (pseudo-)gradient ``g`` (:func:`~sparkdp.rules.pseudo_gradient`); the server sets the
    centre's ``.grad`` to ``g`` (times a staleness factor) and steps its own optimizer, by
    default ``torch.optim.SGD(lr=lr)``, i.e. ``w <- w - lr * g``. Registered as ``"asgd"``;
    ``"hogwild"`` is ``locking=Locking.NONE``, ``"sa-asgd"`` ``staleness_scaling="inverse"``,
    ``"dynsgd"`` ``staleness_scaling="dynsgd"`` (sources: docs/algorithms.md §4).
    ``Push.local_steps`` is not used: the worker already divides by ``k`` (section 8).

    Args:
        lr: server learning rate (> 0). With the ADAG-normalised pseudo-gradient,
            ``lr`` equal to the worker's learning rate moves the centre as far as one
            worker's average step; lower it (roughly by the number of workers) if the
            loss oscillates or diverges as workers are added (docs/algorithms.md §4).
        server_optimizer: a ``torch.optim`` name (``"sgd"``, ``"adam"``, ``"adagrad"``,
            ... case-insensitive) built as ``cls(params, lr=lr, **server_optimizer_kwargs)``,
            or a callable ``params -> Optimizer`` (then ``lr`` and the kwargs are not used).
        server_optimizer_kwargs: extra arguments of the named optimizer, e.g.
            ``{"momentum": 0.9}``. Server momentum adds to the implicit momentum of
            asynchrony: keep it low (or use ``"ddcasgd"``) with many workers.
        staleness_scaling: ``"none"``, ``"dynsgd"`` (``g / (1 + tau)``) or ``"inverse"``
            (``g / tau``, ``g`` at ``tau = 0``). Use one if stale workers (large tau in the
            metrics) make training unstable. It scales the gradient, which for SGD is
            scaling the learning rate; scale-invariant optimizers such as Adam mostly
            undo it.
        locking: ``Locking.GLOBAL`` (one lock per apply) or ``Locking.NONE`` (Hogwild:
            lost updates accepted). Lock-free needs the stateless plain SGD step, since
            concurrent steps of a stateful optimizer would race on ``.grad`` and its state.
        num_workers: unused; accepted so that callers can pass it to every rule.

    Examples:
        >>> import torch
        >>> w = [torch.tensor([1.0, 2.0])]
        >>> ASGD(lr=0.5).apply(w, Push(worker=0, staleness=0, tensors=(torch.tensor([2.0, -2.0]),)))
        >>> w[0]
        tensor([0., 3.])
    """

    def __init__(
        self,
        *,
        lr: float = 0.01,
        server_optimizer: str | OptimizerFactory = "sgd",
        server_optimizer_kwargs: dict[str, Any] | None = None,
        staleness_scaling: str = "none",
        locking: Locking | str = Locking.GLOBAL,
        num_workers: int | None = None,
    ) -> None:
        name = type(self).__name__
        self.lr = check_number(
            name,
            "lr",
            lr,
            low=0,
            low_open=True,
            hint="lr is the server learning rate; 0.01-0.1 is typical for SGD.",
        )
        kwargs = dict(server_optimizer_kwargs or {})
        if "lr" in kwargs:
            raise ConfigError(
                f"{name}: give the server learning rate as `lr=`, not in server_optimizer_kwargs."
            )
        if "momentum" in kwargs:  # torch only rejects momentum < 0; >= 1 diverges
            check_number(
                name,
                "server_optimizer_kwargs['momentum']",
                kwargs["momentum"],
                low=0,
                high=1,
                high_open=True,
                hint="Server momentum adds to asynchrony's own; keep it well below 1.",
            )
        if isinstance(server_optimizer, str):
            classes = server_optimizers()
            key = server_optimizer.lower()
            if key not in classes:
                raise ConfigError(
                    f"{name}: unknown server_optimizer {server_optimizer!r}. Available: {', '.join(sorted(classes))}; "
                    "or pass a callable params -> torch.optim.Optimizer."
                )
            # every torch.optim class takes (params, lr=...), which the base Optimizer's signature does not say
            optimizer_class = cast(Callable[..., Optimizer], classes[key])
            self._factory: OptimizerFactory = functools.partial(optimizer_class, lr=self.lr, **kwargs)
            try:  # surface bad kwargs (momentum=-1, betas=...) now, not at the first push
                self._factory([torch.nn.Parameter(torch.zeros(1))])
            except (TypeError, ValueError) as e:
                raise ConfigError(
                    f"{name}: server_optimizer {server_optimizer!r} rejected {kwargs}: {e}"
                ) from e
            # plain SGD is applied as one in-place add: no .grad, no state, safe without locks
            self._plain = key == "sgd" and not kwargs
        elif callable(server_optimizer):
            if kwargs:
                raise ConfigError(f"{name}: server_optimizer_kwargs only apply to a named server_optimizer.")
            self._factory = server_optimizer
            self._plain = False
        else:
            raise ConfigError(
                f"{name}: server_optimizer must be a torch.optim name or a callable; got {server_optimizer!r}."
            )
        self.staleness_scaling = check_choice(
            name, "staleness_scaling", staleness_scaling, STALENESS_SCALINGS
        )
        self.locking = as_locking(name, locking)
        if self.locking is Locking.NONE and not self._plain:
            raise ConfigError(
                f"{name}: locking='none' (Hogwild) needs the plain SGD server step; got server_optimizer="
                f"{server_optimizer!r} with {kwargs}. Use locking='global' for a stateful server optimizer."
            )
        if num_workers is not None:
            check_int(name, "num_workers", num_workers, low=1)
        self._params: list[torch.nn.Parameter] | None = None
        self._opt: Optimizer | None = None
        self._pending: dict[str, Any] | None = None  # optimizer state loaded before the first apply

    def _optimizer_for(self, center: Sequence[Tensor]) -> tuple[list[torch.nn.Parameter], Optimizer]:
        params, opt = self._params, self._opt
        if (
            params is None
            or opt is None
            or len(params) != len(center)
            or any(
                p.data_ptr() != c.data_ptr() or p.shape != c.shape or p.dtype != c.dtype
                for p, c in zip(params, center, strict=True)
            )
        ):
            # Parameters that alias the centre's storage: the optimizer's in-place step
            # updates the server's tensors directly. Rebuilt (keeping the optimizer state)
            # only if the server hands over different tensors.
            carried = opt.state_dict() if opt is not None else self._pending
            params = [torch.nn.Parameter(c.detach()) for c in center]
            opt = self._factory(params)
            if not isinstance(opt, Optimizer):
                raise ConfigError(
                    f"{type(self).__name__}: server_optimizer returned {type(opt).__name__}, not an Optimizer."
                )
            if carried is not None:
                opt.load_state_dict(copy.deepcopy(carried))
            self._params, self._opt, self._pending = params, opt, None
        return params, opt

    @torch.no_grad()
    def apply(self, center: Sequence[Tensor], push: Push) -> None:
        """Server step ``w <- opt.step(grad = scale(tau) * g)``; plain SGD: ``w -= lr * scale * g``."""
        check_push(type(self).__name__, center, push)
        scale = staleness_scale(push.staleness, self.staleness_scaling)
        if self._plain:
            for c, g in zip(center, push.tensors, strict=True):
                c.add_(like(g, c), alpha=-self.lr * scale)  # the op torch.optim.SGD performs
            return
        params, opt = self._optimizer_for(center)
        for p, g in zip(params, push.tensors, strict=True):
            g = like(g, p)
            p.grad = g if scale == 1.0 else g * scale
        opt.step()
        for p in params:
            p.grad = None  # do not keep the push alive until the next one

    def state_dict(self) -> dict[str, Any]:
        """``{"server_optimizer": torch optimizer state_dict (a copy) or None}``."""
        state = self._opt.state_dict() if self._opt is not None else self._pending
        return {"server_optimizer": copy.deepcopy(state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        opt_state = state.get("server_optimizer")
        if opt_state is not None and self._plain:
            raise ConfigError(
                f"{type(self).__name__}: the checkpoint holds server-optimizer state but this rule uses the "
                "stateless plain SGD step; build the rule with the server_optimizer the checkpoint was written with."
            )
        if self._opt is not None and opt_state is not None:
            self._opt.load_state_dict(copy.deepcopy(opt_state))
        else:
            self._pending = copy.deepcopy(opt_state)
