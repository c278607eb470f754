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
"""

import os

import torch  # noqa: F401  (preloaded for the forked workers)
import torch._dynamo  # noqa: F401  torch.optim imports it on the first optimizer built: ~1.2 s per worker
import torch.distributed  # noqa: F401
from pyspark.daemon import manager

import sparkdp.train.loop  # noqa: F401
from sparkdp.spark.worker_preload import PRELOAD_ENV, preload

if __name__ == "__main__":
    preload(os.environ.get(PRELOAD_ENV, ""))
    manager()
