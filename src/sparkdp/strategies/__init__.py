"""How workers agree on parameters. Chosen by name (``strategy="allreduce"``) or passed as an object."""

from __future__ import annotations

from ..registry import Registry
from ..rules import RULES
from .allreduce import AllReduce
from .async_ps import AsyncParameterServer
from .average import ParameterAveraging
from .base import Launcher, Strategy
from .diloco import DiLoCo
from .fsdp import FSDP
from .hsdp import HSDP
from .zero import ZeRO1

STRATEGIES: Registry[Strategy] = Registry("strategy")
STRATEGIES.register(
    "allreduce",
    AllReduce,
    description="gradient all-reduce every step (DDP buckets, overlapped with backward)",
)
STRATEGIES.register(
    "fsdp",
    FSDP,
    description="fully sharded data parallel: parameters, gradients, optimizer state 1/N per worker",
)
STRATEGIES.register(
    "hsdp",
    HSDP,
    description="hybrid sharded data parallel: fsdp within each host, replicas across hosts",
)
STRATEGIES.register(
    "zero1",
    ZeRO1,
    description="allreduce with the optimizer state sharded: 1/N of it per worker (ZeRO stage 1)",
)
STRATEGIES.register(
    "average",
    ParameterAveraging,
    description="parameter averaging every k local steps (Deeplearning4j style)",
)
STRATEGIES.register(
    "diloco", DiLoCo, description="inner steps, then an outer Nesterov step on the mean change (DiLoCo)"
)

# Asynchronous strategies: one preset of one class per update rule (design rule 3), generated
# from the rule registry so that every rule is reachable by name.
for _entry in RULES:
    STRATEGIES.register(_entry.name, AsyncParameterServer, description=_entry.description, rule=_entry.name)


def resolve_strategy(strategy: str | Strategy, **options) -> Strategy:
    """A Strategy instance from a name (with options) or an instance (options must be empty)."""
    if isinstance(strategy, Strategy):
        if options:
            raise ValueError(
                "pass strategy options either to the Strategy object or as strategy_options, not both"
            )
        return strategy
    return STRATEGIES.create(strategy, **options)


__all__ = [
    "FSDP",
    "HSDP",
    "STRATEGIES",
    "AllReduce",
    "AsyncParameterServer",
    "DiLoCo",
    "Launcher",
    "ParameterAveraging",
    "Strategy",
    "ZeRO1",
    "resolve_strategy",
]
