"""A synchronous worker told to stop (SIGTERM, SIGHUP) saves at the next step boundary, then stops.

A preemption reaches one process: a worker whose executor or machine is going away gets
SIGTERM (Kubernetes and YARN stop a container that way), or SIGHUP (PySpark's worker daemon
sends it to its workers when the executor's JVM shuts down, as it does when a standalone Worker
stopping kills its executors). Spark's own decommissioning (``spark.decommission.enabled``)
signals no Python process: the executor only stops taking tasks and waits for its running ones.
The driver sees it, though, and posts a notice beside the job's checkpoints
(driver/preemption.py); rank 0 polls for it every second in a thread. Either only sets a flag.
The ranks agree on it through the
collective: at every optimizer-step boundary each rank starts a SUM all-reduce of a one-int-per-rank
tensor (its own entry set when it was signalled) and waits for the one started at the previous
boundary. The reduction runs beside the next step's compute, so it costs no step time, and every
rank sees the same flags at the same step: the stop comes at most one step after the signal.

The training loop then saves a checkpoint there and raises :class:`~sparkdp.errors.WorkerPreempted`,
which the job controller restarts from that checkpoint without counting it against
``max_restarts`` (driver/controller.py). A second signal while the worker is saving restores the
previous handler and delivers the signal again, so the process dies as it would have.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch

from ..comm.base import Collective, Pending
from ..errors import WorkerPreempted
from .checkpoint import CheckpointPolicy

log = logging.getLogger(__name__)

#: the signals that mean "this process is going away": stop at the next step boundary
SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: how often rank 0 looks for the driver's notice (one stat, or one HEAD on an object store)
NOTICE_POLL_S = 1.0


class PreemptionWatch:
    """One worker's preemption flag and the ranks' agreement on it (see the module docstring).

    :meth:`step_boundary` is called by every rank after every optimizer step (all ranks call it
    equally often) and returns the ranks that were signalled, once every rank knows, else ().
    """

    def __init__(self, collective: Collective, notice: Callable[[], bool] | None = None) -> None:
        self.collective = collective
        self.signal: int | None = None  # the first signal this process received
        self.noticed = False  # the driver's notice was seen (``notice``, polled by a thread)
        self._pending: Pending | None = None
        self._previous: dict[int, Any] = {}
        self._stop = threading.Event()
        self._poller = (
            threading.Thread(target=self._poll, args=(notice,), name="sparkdp-preempt-notice", daemon=True)
            if notice is not None
            else None
        )

    def _poll(self, notice: Callable[[], bool]) -> None:
        while not self._stop.wait(NOTICE_POLL_S):
            if notice():
                self.noticed = True
                log.warning(
                    "worker %d: the driver saw this job's executor decommissioning; saving a checkpoint "
                    "at the next step boundary",
                    self.collective.rank,
                )
                return

    # -- the signal side -----------------------------------------------------------------
    def install(self) -> bool:
        """Catch :data:`SIGNALS` (main thread only, where Python runs handlers); False when it
        cannot (another thread, or a platform without them)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        if self._poller is not None:
            self._poller.start()
        return True

    def restore(self) -> None:
        """Put the handlers back as they were before :meth:`install` (and stop polling)."""
        self._stop.set()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:  # asked twice: die as the previous handler would
            self.restore()
            os.kill(os.getpid(), signum)
            return
        self.signal = signum
        log.warning(
            "worker %d: received %s; saving a checkpoint at the next step boundary",
            self.collective.rank,
            signal.Signals(signum).name,
        )

    # -- the agreement -------------------------------------------------------------------
    def step_boundary(self) -> tuple[int, ...]:
        """Start this boundary's reduction, finish the previous one: the signalled ranks, by the
        previous boundary's flags (every rank gets the same answer at the same boundary)."""
        agreed = self._finish()
        if agreed:
            return agreed
        flags = torch.zeros(self.collective.world_size, dtype=torch.int32, device=self.collective.device)
        if self.signal is not None or self.noticed:
            flags[self.collective.rank] = 1
        self._pending = self.collective.start_all_reduce(flags, "sum")
        return ()

    def drain(self) -> tuple[int, ...]:
        """Finish the reduction still in flight (at an epoch's end, before other collectives'
        results are read): the signalled ranks, or ()."""
        return self._finish()

    def _finish(self) -> tuple[int, ...]:
        if self._pending is None:
            return ()
        flags = self._pending.wait()
        self._pending = None
        assert isinstance(flags, torch.Tensor)
        return tuple(int(r) for r in torch.nonzero(flags.cpu()).flatten().tolist())


@contextlib.contextmanager
def watch_preemption(
    collective: Collective, checkpoints: CheckpointPolicy | None = None
) -> Iterator[PreemptionWatch | None]:
    """A :class:`PreemptionWatch` for the training loop's duration (the handlers restored after),
    or None where there is nothing to agree with (an asynchronous worker) or no handler can be
    installed (outside the main thread). With ``checkpoints``, rank 0 also polls the store for
    the driver's notice."""
    if collective.independent:
        yield None
        return
    notice = checkpoints.store().notice_posted if checkpoints is not None and collective.rank == 0 else None
    watch = PreemptionWatch(collective, notice)
    if not watch.install():
        yield None
        return
    try:
        yield watch
    finally:
        watch.restore()


def preempted(ranks: tuple[int, ...], epoch: int, step: int, saved: bool) -> WorkerPreempted:
    """The error every rank raises once the ranks agreed to stop (the same text on each)."""
    who = ", ".join(map(str, ranks))
    where = f"epoch {epoch + 1}, step {step}" if step else f"the start of epoch {epoch + 1}"
    what = (
        f"a checkpoint was saved at {where}" if saved else f"stopped at {where} without a checkpoint policy"
    )
    err = WorkerPreempted(f"worker {who} preempted (its executor or machine is going away); {what}")
    err.rank = ranks[0]
    return err


__all__ = ["SIGNALS", "PreemptionWatch", "preempted", "watch_preemption"]
