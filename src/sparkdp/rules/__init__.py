"""Update rules of the asynchronous parameter server: pure tensor math (design rule 1, docs/architecture.md).

Look a rule up by name with ``RULES.create(name, **hparams)`` or describe it with a
:class:`RuleSpec`; the parameter server builds one instance per shard of the parameters.

Example:
    >>> rule = RULES.create("hogwild", lr=0.1)
    >>> rule.locking
    <Locking.NONE: 'none'>
    >>> RuleSpec("easgd", {"num_workers": 4}).create().alpha
    0.225
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry
from .asgd import ASGD, server_optimizers
from .base import Locking, Push, PushKind, UpdateRule
from .dcasgd import DCASGD, DelayCompensatedRule
from .ddcasgd import DDCASGD
from .easgd import EASGD
from .functional import delay_cap, delay_compensation, momentum_for_delay, pseudo_gradient, staleness_scale

__all__ = [
    "ASGD",
    "DCASGD",
    "DDCASGD",
    "EASGD",
    "RULES",
    "DelayCompensatedRule",
    "Locking",
    "Push",
    "PushKind",
    "RuleSpec",
    "UpdateRule",
    "delay_cap",
    "delay_compensation",
    "momentum_for_delay",
    "pseudo_gradient",
    "server_optimizers",
    "staleness_scale",
]

RULES: Registry[UpdateRule] = Registry("update rule")
RULES.register(
    "asgd", ASGD, description="ASGD / Downpour SGD: a server optimizer step per push (Dean et al. 2012)"
)
RULES.register(
    "hogwild", ASGD, description="ASGD without locks (Niu, Recht, Re, Wright 2011)", locking=Locking.NONE
)
RULES.register(
    "dynsgd",
    ASGD,
    description="ASGD with pushes scaled by 1/(1+tau) (dist-keras DynSGD)",
    staleness_scaling="dynsgd",
)
RULES.register(
    "sa-asgd",
    ASGD,
    description="staleness-aware ASGD, lr alpha0/tau (Zhang et al. 2016)",
    staleness_scaling="inverse",
)
RULES.register("ssgd-aware", ASGD, description="alias of sa-asgd", staleness_scaling="inverse")
RULES.register("easgd", EASGD, description="asynchronous elastic averaging (Zhang, Choromanska, LeCun 2015)")
RULES.register(
    "easgd-deepspark", EASGD, description="DeepSpark's lock-free EASGD variant", variant="deepspark"
)
RULES.register("dcasgd", DCASGD, description="delay-compensated ASGD, adaptive lambda (Zheng et al. 2017)")
RULES.register("dcasgd-a", DCASGD, description="DC-ASGD-a (adaptive lambda)", variant="a")
RULES.register("dcasgd-c", DCASGD, description="DC-ASGD-c (constant lambda)", variant="c")
RULES.register(
    "ddcasgd", DDCASGD, description="dynamic DC-ASGD: delay-dependent momentum and clipped compensation"
)


@dataclass(frozen=True)
class RuleSpec:
    """A rule name plus hyper-parameters: a picklable factory for one rule instance per shard.

    The hyper-parameters are validated once at construction (a test instance is built),
    so a typo fails before any worker starts.

    Args:
        name: a name in :data:`RULES` (case-insensitive).
        hparams: constructor arguments of that rule.
    """

    name: str
    hparams: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hparams", dict(self.hparams))
        self.create()

    def create(self, **overrides: Any) -> UpdateRule:
        """A fresh rule instance (``overrides`` win over ``hparams``)."""
        return RULES.create(self.name, **{**self.hparams, **overrides})
