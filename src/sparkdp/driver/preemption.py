"""The driver's half of preemption: while a synchronous stage runs, watch for its executors being
decommissioned and ask its workers to save and stop (train/preempt.py is the workers' half).

Spark's decommissioning tells no Python process; the driver's task scheduler knows
(spark/decommission.py). On the first executor running one of the stage's tasks that starts
decommissioning, the driver posts a notice beside the job's checkpoints; rank 0 sees it within
a second, the ranks agree on the step, rank 0 saves there, and every rank stops with
``WorkerPreempted``, which the controller restarts from that checkpoint on the executors left,
without counting it against ``max_restarts``. The notice is removed when the stage ends, so the
next attempt does not see it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..train.checkpoint import CheckpointPolicy
from ..train.preempt import notice_for

log = logging.getLogger(__name__)


@contextmanager
def decommission_notice(spark: Any, policy: CheckpointPolicy | None) -> Iterator[None]:
    """Watch the stage run in this block (nothing without a checkpoint policy: the notice goes
    beside the job's checkpoints, and a stop needs somewhere to save)."""
    if policy is None:
        yield
        return
    from ..spark.decommission import DecommissionWatch

    posted = notice_for(policy)

    def notice(executors: list[str]) -> None:
        log.warning(
            "sparkdp: executor %s is decommissioning: asking the workers to save a checkpoint and stop",
            ", ".join(executors),
        )
        posted.post()

    watch = DecommissionWatch(spark, notice)
    try:
        yield
    finally:
        watch.close()
        posted.clear()


__all__ = ["decommission_notice"]
