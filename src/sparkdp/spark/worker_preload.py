"""Modules a Python worker daemon imports before it forks the workers of some jobs only.

Spark starts one worker daemon per distinct task environment (the Python function's
``envVars``: the SparkContext's ``environment`` when the function was made). A DataFrame
function made inside :func:`preloading` carries :data:`PRELOAD_ENV`, so its tasks fork from a
daemon of their own that imported those modules once (:mod:`sparkdp.spark.daemon`), while every
other job keeps the plain daemon. Only names in :data:`PRELOADS` are imported and only the
functions of :data:`WARM_UPS` called: the variable selects among fixed lists, it never names
code to run.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

#: the environment variable the daemon reads
PRELOAD_ENV = "SPARKDP_WORKER_PRELOAD"
#: what each preload name imports (``transformers``: what generating with a causal LM needs
#: before the model's own module, which from_pretrained imports by its config; modeling_utils
#: and modeling_layers are what every architecture's module imports first, about 0.2 s of a
#: task's start-up when left to it; pandas and pyarrow's shim of it: pyarrow imports them on a
#: task's first ``pa.array``, about 0.2 s)
PRELOADS: dict[str, tuple[str, ...]] = {
    "transformers": (
        "transformers",
        "transformers.generation.utils",
        "transformers.models.auto.modeling_auto",
        "transformers.modeling_utils",
        "transformers.modeling_layers",
        "tokenizers",
        "safetensors.torch",
        "pandas",
        "pyarrow.pandas_compat",
    ),
}


def _conversion_table() -> None:
    """Build ``from_pretrained``'s table of checkpoint key conversions: about 1,000 regular
    expressions compiled on a process's first model load (0.06 s), then kept in a module global."""
    from transformers import conversion_mapping

    build = getattr(conversion_mapping, "get_checkpoint_conversion_mapping", None)
    if build is not None:
        build("")  # (any model type: the whole table is built; "" has no entry of its own)


#: what each preload name does after its imports: fill caches a process builds on first use
WARM_UPS: dict[str, Callable[[], None]] = {"transformers": _conversion_table}


def preload(names: str) -> None:
    """Import the module lists of the comma-separated preload ``names`` and run their warm-ups
    (unknown names, missing packages and failed warm-ups are skipped: the task then imports and
    builds what it needs itself)."""
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            for module in PRELOADS.get(name, ()):
                importlib.import_module(module)
        except ImportError:
            continue
        warm_up = WARM_UPS.get(name)
        if warm_up is not None:
            try:
                warm_up()
            except Exception:  # noqa: BLE001  (another transformers version: the task builds it itself)
                log.debug("worker preload %r: its warm-up failed", name, exc_info=True)


@contextlib.contextmanager
def preloading(session: Any, name: str) -> Iterator[None]:
    """Within this block, DataFrame functions made on ``session`` fork from a daemon that has
    preloaded ``name`` (a key of :data:`PRELOADS`). A Spark Connect session, whose functions are
    made on the server, is left as it is."""
    context = getattr(session, "sparkContext", None) if not _is_connect(session) else None
    environment = getattr(context, "environment", None)
    if not isinstance(environment, dict):
        yield
        return
    before = environment.get(PRELOAD_ENV)
    environment[PRELOAD_ENV] = name
    try:
        yield
    finally:
        if before is None:
            environment.pop(PRELOAD_ENV, None)
        else:
            environment[PRELOAD_ENV] = before


def _is_connect(session: Any) -> bool:
    from .cluster import is_connect

    return is_connect(session)


__all__ = ["PRELOADS", "PRELOAD_ENV", "WARM_UPS", "preload", "preloading"]
