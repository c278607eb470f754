"""How workers agree on parameters. Chosen by name (``strategy="allreduce"``) or passed as an object."""

from __future__ import annotations

from ..registry import Registry
from .allreduce import AllReduce
from .async_ps import AsyncParameterServer
from .average import ParameterAveraging
from .base import Strategy

STRATEGIES: Registry[Strategy] = Registry("strategy")
STRATEGIES.register("allreduce", AllReduce,
                    description="gradient all-reduce every step (DDP buckets, overlapped with backward)")
STRATEGIES.register("average", ParameterAveraging,
                    description="parameter averaging every k local steps (Deeplearning4j style)")

# Asynchronous strategies: one per update rule, as presets of one class (STYLE.md G4).
for _rule, _what in [
    ("asgd", "asynchronous SGD / Downpour through the parameter server (server optimizer applies pushes)"),
    ("hogwild", "ASGD applied lock-free on the server (Hogwild!)"),
    ("easgd", "asynchronous elastic averaging SGD, alpha = 0.9/workers (Zhang et al. 2015)"),
    ("easgd-deepspark", "DeepSpark's lock-free EASGD variant (convex combinations)"),
    ("dcasgd", "delay-compensated ASGD, adaptive lambda (DC-ASGD-a, Zheng et al. 2017)"),
    ("dcasgd-c", "delay-compensated ASGD, constant lambda 0.04 (DC-ASGD-c)"),
    ("ddcasgd", "dynamic delay-compensated ASGD: delay-dependent momentum and clipped compensation"),
    ("sa-asgd", "staleness-aware ASGD, lr alpha0/tau (Zhang et al. 2016)"),
    ("dynsgd", "ASGD with pushes scaled by 1/(1+tau) (dist-keras DynSGD)"),
]:
    STRATEGIES.register(_rule, AsyncParameterServer, description=_what, rule=_rule)


def resolve_strategy(strategy: str | Strategy, **options) -> Strategy:
    """A Strategy instance from a name (with options) or an instance (options must be empty)."""
    if isinstance(strategy, Strategy):
        if options:
            raise ValueError("pass strategy options either to the Strategy object or as strategy_options, not both")
        return strategy
    return STRATEGIES.create(strategy, **options)


__all__ = ["STRATEGIES", "AllReduce", "AsyncParameterServer", "ParameterAveraging", "Strategy", "resolve_strategy"]
