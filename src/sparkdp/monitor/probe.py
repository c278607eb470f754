"""The worker side of live monitoring: counters the training loop adds to, and a thread that
sends them to the driver's :class:`~sparkdp.monitor.hub.MonitorHub`.

The loop's cost is a few float additions per step (``batch_arrived``, ``step_done``); the
thread wakes every ``interval_s``, samples the process and the host with psutil and sends one
record of *cumulative* values (a lost or late record is made good by the next one). Records
travel on the parameter-server transport's authenticated channel (``Op.REPORT``, JSON only).
Monitoring never fails training: a driver that cannot be reached turns this worker's probe off
with one warning.

:meth:`Probe.ask` sends a record from the training thread itself and waits for the driver's
answer (``Op.ASK``): how a stoppable job's epoch end learns whether the driver wants it to stop.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: text of one forwarded output record at most (JSON frames are limited to 1 MiB)
_OUTPUT_CHUNK = 256 * 1024


@dataclass(frozen=True)
class MonitorLink:
    """Where a worker sends its records (built by the driver, shipped inside the job)."""

    info: Any  # sparkdp.ps.transport.base.ConnectInfo (its repr hides the secret)
    interval_s: float = 2.0


class Probe:
    """One worker's monitoring: call :meth:`batch_arrived` / :meth:`step_done` from the loop."""

    def __init__(
        self,
        link: MonitorLink,
        rank: int,
        comm_stats: Callable[[], dict[str, float]] | None = None,
        *,
        connect: Callable[..., Any] | None = None,
    ) -> None:
        import psutil

        self.rank, self.link = rank, link
        self.comm_stats = comm_stats or (lambda: {})
        self.epoch = self.step = self.steps = self.samples = 0
        self.tokens: int | None = None  # training tokens of a language model's batches, once seen
        self.saved: tuple[int, int] | None = None  # (steps, samples) at this attempt's last checkpoint
        self.loss_sum, self.data_s, self.compute_s = 0.0, 0.0, 0.0
        self._comm_mark = 0.0  # the strategy's communication seconds when the current step began
        self.reports_loss = True
        self.started = time.time()
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call starts the measurement
        self._psutil = psutil
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stop = threading.Event()
        self._client = None
        self._unanswered = False
        try:
            if connect is None:
                from ..ps.transport.tcp import TcpTransport

                connect = TcpTransport().connect
            info = link.info
            self._client = connect(info.address, info.secret, rank, timeout=10.0, tls_cert=info.tls_cert)
        except Exception as exc:  # monitoring must not fail the job
            log.warning(
                "worker %d: live monitoring is off, the driver's monitor at %s is unreachable: %s",
                rank,
                link.info.address,
                exc,
            )
            return
        self._thread = threading.Thread(target=self._run, name=f"sparkdp-monitor-{rank}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> bool:
        return self._client is not None

    # -- called by the training loop --------------------------------------------------------
    def start_epoch(self, epoch: int, steps_per_epoch: int | None, epochs: int) -> None:
        self.epoch, self.step = epoch, 0
        self.event("epoch_start", epoch=epoch + 1, epochs=epochs, steps_per_epoch=steps_per_epoch)

    def batch_arrived(self, waited_s: float) -> None:
        self.data_s += waited_s
        self._comm_mark = self._comm_seconds()

    def _comm_seconds(self) -> float:
        return float(self.comm_stats().get("comm_s", 0.0))

    def step_done(
        self,
        seconds: float,
        rows: int,
        loss: float | None,
        *,
        stepped: bool = True,
        tokens: int | None = None,
    ) -> None:
        """One batch done. ``loss`` None: unknown (the user's own loop, counted from its optimizer
        steps). ``stepped``: the batch ended an optimizer step (with gradient accumulation only
        every ``accumulate``-th does): steps count optimizer steps, as ``warmup_steps`` and the
        schedules do. ``tokens``: the batch's training tokens (a language model's dict batch).

        A step's compute is its time less the communication inside it; communication outside
        steps (a first pull, an epoch's end) is communication only, never negative compute."""
        comm = self._comm_seconds()
        self.compute_s += max(seconds - (comm - self._comm_mark), 0.0)
        self._comm_mark = comm
        if stepped:
            self.steps += 1
            self.step += 1
        self.samples += rows
        if tokens is not None:
            self.tokens = (self.tokens or 0) + tokens
        if loss is None:
            self.reports_loss = False
        else:
            self.loss_sum += loss * rows

    def checkpointed(self) -> None:
        """A checkpoint holds the work so far: what a failure of this attempt loses starts here."""
        self.saved = (self.steps, self.samples)

    def count_steps(self, optimizer: Any, rows: int, comm_stats: Callable[[], dict[str, float]]) -> None:
        """Count the steps of a loop sparkdp does not run (``distribute``): every ``optimizer.step()``
        is one step of ``rows`` rows, and the time since the one before it is the step's."""
        self.comm_stats = comm_stats
        self._comm_mark = self._comm_seconds()
        last = [time.perf_counter()]

        def counted(_opt: Any, _args: Any, _kwargs: Any) -> None:
            now = time.perf_counter()
            self.step_done(now - last[0], rows, None)
            last[0] = now

        optimizer.register_step_post_hook(counted)

    def event(self, kind: str, **fields: Any) -> None:
        """Queue a record (epoch results, output lines, warnings) for the sending thread."""
        if self._client is not None:
            self._queue.put({"type": kind, "rank": self.rank, "time": time.time(), **fields})

    def output(self, stream: str, text: str) -> None:
        for i in range(0, len(text), _OUTPUT_CHUNK):
            self.event("output", stream=stream, text=text[i : i + _OUTPUT_CHUNK])

    def ask(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Send a record now and return the driver's answer; ``{}`` without one (no monitoring,
        or the driver did not answer: logged once, and training goes on)."""
        if self._client is None or self._unanswered:
            return {}
        try:
            return self._client.ask({"type": kind, "rank": self.rank, "time": time.time(), **fields})
        except Exception as exc:  # monitoring must not fail the job
            self._unanswered = True
            log.warning("worker %d: the driver did not answer (no further questions): %s", self.rank, exc)
            return {}

    def close(self) -> None:
        """Send a last record and stop the thread (waits for queued records, a few seconds at most)."""
        if self._client is None:
            return
        self._queue.put(self.snapshot())
        self._queue.put(None)
        self._thread.join(10.0)
        try:
            self._client.close()
        except OSError:
            pass
        self._client = None

    # -- the sending thread -----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Cumulative counters and the process's and host's usage now."""
        comm = self.comm_stats()
        sent, recv = _host_network(self._psutil)
        return {
            "type": "metrics",
            "rank": self.rank,
            "time": time.time(),
            "host": socket.gethostname(),
            "epoch": self.epoch + 1,
            "step": self.step,
            "steps": self.steps,
            "samples": self.samples,
            **({"loss_sum": self.loss_sum} if self.reports_loss else {}),
            **({"tokens": self.tokens} if self.tokens is not None else {}),
            **(
                {"saved_steps": self.saved[0], "saved_samples": self.saved[1]}
                if self.saved is not None
                else {}
            ),
            "data_s": self.data_s,
            "compute_s": self.compute_s,
            "comm_s": comm.get("comm_s", 0.0),
            "bytes_sent": comm.get("bytes_sent", 0),
            "bytes_recv": comm.get("bytes_recv", 0),
            "cpu_percent": self._process.cpu_percent(None),
            "rss_bytes": self._process.memory_info().rss,
            "net_sent": sent,
            "net_recv": recv,
        }

    def _run(self) -> None:
        client = self._client
        assert client is not None  # the thread starts once connected
        next_at = time.monotonic() + self.link.interval_s
        while True:
            try:
                record = self._queue.get(timeout=max(next_at - time.monotonic(), 0.0))
            except queue.Empty:
                record = self.snapshot()
                next_at = time.monotonic() + self.link.interval_s
            if record is None:
                return
            try:
                client.report(record)
            except Exception as exc:  # the driver went away: stop quietly, training goes on
                log.warning("worker %d: live monitoring stopped: %s", self.rank, exc)
                return


def _host_network(psutil: Any) -> tuple[int, int]:
    """Bytes the host sent and received on its network interfaces (loopback left out: on one
    machine it is the workers talking to each other, not the network)."""
    sent = recv = 0
    for name, counters in psutil.net_io_counters(pernic=True).items():
        if name != "lo" and not name.startswith("lo"):
            sent += counters.bytes_sent
            recv += counters.bytes_recv
    return sent, recv


class NoProbe:
    """The probe of a job without monitoring: every call does nothing."""

    active = False

    def start_epoch(self, *args: Any) -> None: ...
    def batch_arrived(self, waited_s: float) -> None: ...
    def step_done(
        self,
        seconds: float,
        rows: int,
        loss: float | None,
        *,
        stepped: bool = True,
        tokens: int | None = None,
    ) -> None: ...
    def checkpointed(self) -> None: ...
    def count_steps(self, optimizer: Any, rows: int, comm_stats: Callable[..., Any]) -> None: ...
    def event(self, kind: str, **fields: Any) -> None: ...
    def output(self, stream: str, text: str) -> None: ...
    def ask(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...


#: what a worker reports its live figures through: a :class:`Probe`, or a :class:`NoProbe`
WorkerProbe = Probe | NoProbe


def open_probe(
    link: MonitorLink | None, rank: int, comm_stats: Callable[[], dict[str, float]] | None = None
) -> WorkerProbe:
    """A :class:`Probe` when the job is monitored, else a :class:`NoProbe`."""
    return Probe(link, rank, comm_stats) if link is not None else NoProbe()
