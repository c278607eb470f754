"""PySpark's worker daemon with torch (and sparkdp) imported once, before it forks workers.

PySpark forks every Python worker from a daemon process. Stock workers import
torch when the first task unpickles sparkdp code — one to several seconds per
worker, paid again whenever a worker is replaced. Importing here, in the parent,
gives every forked worker the modules for free (configured through
``spark.python.daemon.module`` by :func:`sparkdp.session`). No thread pools are
started by these imports (checked: ``torch._dynamo`` and ``transformers`` add no
thread), so forking afterwards is safe.

Hugging Face ``transformers`` (about 1.3 s to import) is preloaded only in the daemon
that ``sparkdp.generate``'s tasks start from: Spark keys its daemons by the task's
environment, and :func:`sparkdp.spark.worker_preload.preloading` gives those tasks
:data:`~sparkdp.spark.worker_preload.PRELOAD_ENV`. Training workers keep a daemon
without it: its mappings would count against ``spark.executor.pyspark.memory``'s
address-space limit in every worker.

Two more costs of a worker's start are paid here once. PySpark's own worker module
(``pyspark.worker`` and the ten modules it imports, compiled from source on every import:
PySpark runs from ``pyspark.zip``, and a zip holds no bytecode cache) is imported by each
worker after the fork, about 0.08 s; the daemon imports it first (no thread is started by
it). And every worker puts the task's Spark files directory on ``sys.path`` and so calls
``importlib.invalidate_caches()``, which on Python 3.11 makes each cached zip importer re-read
its archive's directory: the daemon's imports leave one per package of ``pyspark.zip`` (about
20, 0.2 s a task). The daemon drops them from ``sys.path_importer_cache`` before it forks: a
worker that imports from the zip again gets a new importer from the directory cache the
daemon already read.
"""

import importlib
import os
import sys
import zipimport

import torch  # noqa: F401  (preloaded for the forked workers)
import torch._dynamo  # noqa: F401  torch.optim imports it on the first optimizer built: ~1.2 s per worker
import torch.distributed  # noqa: F401
from pyspark.daemon import manager

import sparkdp.train.loop  # noqa: F401
from sparkdp.spark.worker_preload import PRELOAD_ENV, preload


def worker_module() -> str:
    """The module ``pyspark.daemon``'s workers run (its rule: the daemon's first argument when
    that names a PySpark module, else ``pyspark.worker``)."""
    return sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark") else "pyspark.worker"


def forget_zip_importers() -> None:
    """Drop the cached zip importers (see the module docstring): a cache the import system refills."""
    for path, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            del sys.path_importer_cache[path]


if __name__ == "__main__":
    preload(os.environ.get(PRELOAD_ENV, ""))
    importlib.import_module(worker_module())
    forget_zip_importers()
    manager()
