"""A synchronous worker told to stop (SIGTERM, SIGHUP) saves at the next step boundary, then stops.

A preemption reaches one process: a worker whose executor or machine is going away gets
SIGTERM (Kubernetes and YARN stop a container that way), or SIGHUP (PySpark's worker daemon
sends it to its workers when the executor's JVM shuts down, as it does when a standalone Worker
stopping kills its executors). Spark's own decommissioning (``spark.decommission.enabled``)
signals no Python process: the executor only stops taking tasks and waits for its running ones.
The driver sees it, though, and posts a notice beside the job's checkpoints
(driver/preemption.py); rank 0 polls for it every second in a thread. Either only sets a flag.
The ranks agree on it through the
collective: at an optimizer-step boundary each rank starts a SUM all-reduce of one int per rank
(its own entry set when it was signalled) and reads it at the next boundary, so the reduction
runs beside that step's compute, and every rank sees the same flags at the same step. Such a
reduction starts about every :data:`AGREE_EVERY_S` seconds of training: rank 0 proposes how many
steps that is from its step time, in the same tensor, so every rank learns the same cadence.
One tiny all-reduce per half second costs nothing measurable even where steps take milliseconds
(benchmarks/preempt_cost.py), and the stop comes at most about half a second plus one step after
the signal, with every step before the stop saved.

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
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from ..comm.base import Collective, Pending
from ..errors import WorkerPreempted
from .checkpoint import CheckpointPolicy
from .role import role_of

log = logging.getLogger(__name__)

#: the signals that mean "this process is going away": stop at the next step boundary
SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: how often rank 0 looks for the driver's notice (one stat, or one HEAD on an object store)
NOTICE_POLL_S = 1.0
#: a rank's entry in the agreement: it received a signal, or saw the driver's notice
SIGNALLED, NOTICED = 1, 2
#: about how many seconds of training pass between two agreements (0: one at every step)
AGREE_EVERY_S = 0.5
#: the most steps between two agreements, however short the steps
MAX_INTERVAL = 64


class PreemptionNotice:
    """The driver's request that job ``job_id``'s workers save and stop: an empty file beside its
    checkpoints in ``directory`` (a hidden name, never a checkpoint's: listings, rotation and the
    one-job check ignore it). The driver posts and clears it (driver/preemption.py); rank 0 polls
    :meth:`posted`. It is no checkpoint, so it lives apart from the checkpoint store."""

    def __init__(self, directory: str, job_id: str, storage_options: Mapping[str, Any] | None = None) -> None:
        import fsspec

        self.fs, root = fsspec.core.url_to_fs(str(directory), **dict(storage_options or {}))
        self.root = root.rstrip("/")
        self.path = f"{self.root}/.preempt-{job_id}"

    def post(self) -> None:
        """Ask the job's workers to save and stop (the driver saw their executor decommissioning)."""
        self.fs.pipe_file(self.path, b"")

    def posted(self) -> bool:
        try:
            self.fs.invalidate_cache(self.root)  # object stores' listings are cached per instance
            return bool(self.fs.exists(self.path))
        except OSError:  # an unreachable store says nothing; the next poll asks again
            return False

    def clear(self) -> None:
        try:
            if self.fs.exists(self.path):
                self.fs.rm_file(self.path)
        except OSError as exc:
            log.warning("could not remove the preemption notice %s: %s", self.path, exc)


def notice_for(checkpoints: CheckpointPolicy) -> PreemptionNotice:
    """The preemption notice of the job whose checkpoints ``checkpoints`` says where they go."""
    return PreemptionNotice(
        checkpoints.directory, checkpoints.job_id, checkpoints.settings.checkpoint_storage_options
    )


@dataclass(frozen=True)
class Stop:
    """Why the ranks agreed to stop: the ranks that received a signal, and whether rank 0 saw the
    driver's notice of a decommissioning executor."""

    signalled: tuple[int, ...] = ()
    noticed: bool = False


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
        self._wait = 0  # step boundaries left before the next agreement starts
        self._started = (time.perf_counter(), 0)  # when the last agreement started, at which boundary
        self._boundaries = 0
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
    def step_boundary(self) -> Stop | None:
        """At an optimizer-step boundary: read the agreement started at the previous one (why the
        ranks stop, the same on every rank, or None), and start the next when it is due."""
        self._boundaries += 1
        if self._pending is not None:
            stop = self._finish()
            if stop is not None:
                return stop
        if self._wait > 0:
            self._wait -= 1
            return None
        self._start()
        return None

    def drain(self) -> Stop | None:
        """Finish the agreement still in flight (at an epoch's end, before other collectives'
        results are read): why the ranks stop, or None."""
        return self._finish() if self._pending is not None else None

    def _start(self) -> None:
        coll = self.collective
        flags = torch.zeros(coll.world_size + 1, dtype=torch.int32, device=coll.device)
        if self.signal is not None or self.noticed:  # (each rank writes its own entry: the sum keeps why)
            flags[coll.rank] = SIGNALLED if self.signal is not None else NOTICED
        if coll.rank == 0:  # the steps until the next agreement, from rank 0's step time so far
            began, at = self._started
            step_s = (time.perf_counter() - began) / max(self._boundaries - at, 1)
            flags[-1] = min(max(int(AGREE_EVERY_S / step_s) if step_s > 0 and at else 1, 1), MAX_INTERVAL)
        self._started = (time.perf_counter(), self._boundaries)
        self._pending = coll.start_all_reduce(flags, "sum")

    def _finish(self) -> Stop | None:
        assert self._pending is not None
        flags = self._pending.wait()
        self._pending = None
        assert isinstance(flags, torch.Tensor)
        *values, interval = flags.cpu().tolist()
        self._wait = max(int(interval), 1) - 1
        signalled = tuple(r for r, v in enumerate(values) if v == SIGNALLED)
        if not any(values):
            return None
        return Stop(signalled, noticed=any(v == NOTICED for v in values))


@contextlib.contextmanager
def watch_preemption(
    collective: Collective, checkpoints: CheckpointPolicy | None = None
) -> Iterator[PreemptionWatch | None]:
    """A :class:`PreemptionWatch` for the training loop's duration (the handlers restored after),
    or None where there is nothing to agree with (an asynchronous worker) or no handler can be
    installed (outside the main thread). With ``checkpoints``, rank 0 also polls for the driver's
    :class:`PreemptionNotice` beside them."""
    if not role_of(collective).agrees_with_peers:
        yield None
        return
    notice = notice_for(checkpoints).posted if checkpoints is not None and collective.rank == 0 else None
    watch = PreemptionWatch(collective, notice)
    if not watch.install():
        yield None
        return
    try:
        yield watch
    finally:
        watch.restore()


def preempted(stop: Stop, epoch: int, step: int, saved: bool) -> WorkerPreempted:
    """The error every rank raises once the ranks agreed to stop (the same text on each)."""
    if stop.signalled:
        who = ", ".join(map(str, stop.signalled))
        why = f"worker {who} received SIGTERM or SIGHUP (its executor or machine is going away)"
    else:
        why = "an executor of the job is decommissioning (seen by the driver)"
    where = f"epoch {epoch + 1}, step {step}" if step else f"the start of epoch {epoch + 1}"
    what = f"saved a checkpoint at {where}" if saved else f"stopped at {where} without a checkpoint policy"
    err = WorkerPreempted(f"preempted: {why}; {what}")
    err.rank = stop.signalled[0] if stop.signalled else None
    return err


__all__ = [
    "SIGNALS",
    "PreemptionNotice",
    "PreemptionWatch",
    "Stop",
    "notice_for",
    "preempted",
    "watch_preemption",
]
