"""The fuzz targets' shared budget: ``make test`` runs a quick, derandomized (so repeatable)
count of examples per target; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES`` (100000) and every
target runs that many, with a timeout that guards against a hang rather than sets a budget."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

FULL_RUN = "SPARKDP_FUZZ_EXAMPLES" in os.environ
# generated inputs are large or slow to build on purpose: these checks would only flag that
SLOW_INPUTS = (HealthCheck.too_slow, HealthCheck.data_too_large)


def examples(quick: int) -> int:
    """The examples per target of this run: ``quick`` under ``make test``, else ``make fuzz``'s count."""
    return int(os.environ["SPARKDP_FUZZ_EXAMPLES"]) if FULL_RUN else quick


def fuzz_settings(quick: int, *, suppress=SLOW_INPUTS, database: bool = True) -> settings:
    """Settings for ``examples(quick)`` examples, no deadline; ``database=False`` for targets whose
    inputs hold live objects (sockets, servers) that a replayed example cannot rebuild."""
    count = examples(quick)
    chosen = settings(
        max_examples=count, deadline=None, derandomize=count < 10_000, suppress_health_check=list(suppress)
    )
    return chosen if database else settings(chosen, database=None)


def hang_guard(quick: int, *, per_second: int = 20, floor_s: int = 120) -> pytest.MarkDecorator:
    """A module's timeout: ``floor_s`` under ``make test``, grown with ``make fuzz``'s count."""
    return pytest.mark.timeout(max(floor_s, examples(quick) // per_second))
