"""Modules a Python worker daemon imports before it forks the workers of some jobs only.

Spark starts one worker daemon per distinct task environment (the Python function's
``envVars``: the SparkContext's ``environment`` when the function was made). A DataFrame
function made inside :func:`preloading` carries :data:`PRELOAD_ENV`, so its tasks fork from a
daemon of their own that imported those modules once (:mod:`sparkdp.spark.daemon`), while every
other job keeps the plain daemon. Only names in :data:`PRELOADS` are imported: the variable
selects among fixed module lists, it never names code to run.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

#: the environment variable the daemon reads
PRELOAD_ENV = "SPARKDP_WORKER_PRELOAD"
#: what each preload name imports (``transformers``: what generating with a causal LM needs
#: before the model's own module, which from_pretrained imports by its config; modeling_utils
#: and modeling_layers are what every architecture's module imports first, about 0.2 s of a
#: task's start-up when left to it)
PRELOADS: dict[str, tuple[str, ...]] = {
    "transformers": (
        "transformers",
        "transformers.generation.utils",
        "transformers.models.auto.modeling_auto",
        "transformers.modeling_utils",
        "transformers.modeling_layers",
        "tokenizers",
        "safetensors.torch",
    ),
}


def preload(names: str) -> None:
    """Import the module lists of the comma-separated preload ``names`` (unknown names and
    missing packages are skipped: the task then imports what it needs itself)."""
    for name in filter(None, (n.strip() for n in names.split(","))):
        for module in PRELOADS.get(name, ()):
            try:
                importlib.import_module(module)
            except ImportError:
                break


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


__all__ = ["PRELOADS", "PRELOAD_ENV", "preload", "preloading"]
