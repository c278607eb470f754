"""Where a per-step fault-tolerant job (``fault_tolerance="step"``) starts: its data in an order
the row cursor can address, and the checkpoint its workers start from.

* Data: in-memory data and Parquet files as they are; a DataFrame that is not a plain Parquet
  scan is written to Parquet once in a temporary directory on this machine (removed when the
  job ends), so that its rows have a deterministic order (``spark.dataframe.write_parquet``).
* Checkpoints: with ``checkpoint_dir`` the quorum's rank 0 writes them (``train.step_checkpoint``);
  ``resume=`` starts the first attempt from the newest one of the job it names, and when the
  quorum cannot go on (every worker lost), the job's controller starts the next attempt from the
  newest one this job wrote (or the one it resumed). Another job's checkpoints in the directory
  are refused as in restart mode (``driver.recovery``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..config import JobConfig
from ..data.base import WorkerData
from ..errors import ConfigError
from ..train.checkpoint import Checkpoint, CheckpointPolicy, latest_checkpoint
from ..train.loop import FitSpec
from ..train.row_cursor import RowCursor
from ..train.step_checkpoint import order_key, start_state
from .recovery import checkpoint_policy, refuse_foreign_checkpoints, resume_point, where_from

log = logging.getLogger(__name__)


@contextmanager
def addressable_data(spec: FitSpec, spark: object) -> Iterator[FitSpec]:
    """``spec`` with data whose rows the cursor addresses: a streamed DataFrame written to a
    temporary Parquet copy for the job's duration; any other data as it is."""
    if isinstance(spec.train, WorkerData):
        yield spec
        return
    from ..spark.cluster import on_driver_machine
    from ..spark.dataframe import write_parquet

    if not on_driver_machine(spark):
        raise ConfigError(
            "fault_tolerance='step' writes a DataFrame that is not a plain Parquet scan to a temporary "
            "Parquet copy on this machine, which executors on other machines cannot read. Write it to "
            "Parquet on storage every executor reaches and pass that path (or spark.read.parquet of it)."
        )
    directory = tempfile.mkdtemp(prefix="sparkdp-step-data-")
    try:
        data = write_parquet(spec.train, os.path.join(directory, "data.parquet"))  # (a DataFrameSource)
        yield replace(spec, train=data)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class StepStart:
    """Where each attempt of a per-step fault-tolerant job starts: the checkpoint ``resume=``
    names (the first attempt), or this job's newest (a restart after every worker was lost)."""

    policy: CheckpointPolicy | None
    resumed: Checkpoint | None

    def checkpoint(self, restart: int) -> Checkpoint | None:
        if restart == 0 or self.policy is None:
            return self.resumed
        latest = latest_checkpoint(self.policy.directory, self.policy.job_id, self.policy.settings)
        return latest if latest is not None else self.resumed

    def state(self, restart: int, cursor: RowCursor, data: object) -> tuple[int, bytes | None]:
        """The job step attempt ``restart`` starts at and its workers' start state (None: afresh)."""
        start = self.checkpoint(restart)
        if start is None:
            return 0, None
        epoch = start.quorum["cursor"]["epoch"] if start.quorum is not None else 0
        step, state = start_state(start, cursor, order_key(cursor.order(min(epoch, cursor.epochs - 1), data)))
        log.info("sparkdp: the quorum starts at step %d, from %s", step, start.path)
        return step, state

    def restart_point(self) -> str | None:
        """Where a restart continues, for the controller's line; None: no checkpoints, no restart."""
        if self.policy is None:
            return None
        return where_from(self.checkpoint(1))


@contextmanager
def step_start(job: JobConfig) -> Iterator[StepStart]:
    """The job's checkpoint policy (only with ``checkpoint_dir`` or ``resume``: a per-step job
    keeps no temporary checkpoints) and the checkpoint ``resume=`` names."""
    resumed = resume_point(job)
    lineage = resumed.job_id if resumed is not None else None
    refuse_foreign_checkpoints(job, lineage)
    with checkpoint_policy(job, temporary_ok=False, job_id=lineage) as policy:
        yield StepStart(policy, resumed)


__all__ = ["StepStart", "addressable_data", "step_start"]
