"""The driver side of live monitoring: an authenticated endpoint the workers report to, and
what the records become (the terminal display, the run log, TensorBoard, MLflow, warnings).

Records (JSON objects, see ``sparkdp.monitor.probe``):

* ``metrics``: a worker's cumulative counters and usage; the hub adds the window's rates
  (``samples_per_s``, ``loss``, the data/compute/communication split, network bytes/s);
* ``epoch_start``, ``epoch``: an epoch begins; an epoch's results (rank 0);
* ``stop_query``: whether the driver wants the job to stop (a worker of an asynchronous job);
* ``output``: a chunk of what a worker's script printed (``sparkdp launch``), shown here
  with a ``[rank R]`` prefix;
* ``warning``: stragglers and bottlenecks found here (``sparkdp.monitor.stragglers``);
* ``job``: the whole job's throughput so far (and the parameter server's figures for
  asynchronous jobs); ``summary``: the end.

A per-step fault-tolerant job's workers send none of these: the driver's quorum tells the hub
its progress instead (:meth:`MonitorHub.quorum_progress`: ``job`` records with the committed
steps and the quorum's size) and each leave and join (:meth:`MonitorHub.membership`:
``membership`` records), which the progress line and ``sparkdp report`` show.

The endpoint is the parameter-server transport with no parameter server behind it: the
same HMAC handshake and per-frame MACs, JSON only, bound to the driver's address, and TLS
when the job asks for it (a launched script's whole output crosses the network here).

A record sent as a question (``ASK``) gets ``{"stop": bool}`` back: whether the job's epoch
listener has asked it to stop (a pruned search trial) after an epoch no later than the record's.
Rank 0 sends a stoppable job's epoch results that way, so the answer covers the epoch it just
sent: the listener runs on this connection's thread before the answer goes back, and the job
stops after that same epoch. A worker of an asynchronous job asks at each of its epoch ends
(``stop_query``), so it too stops after that epoch, or at its first end after the decision
if it is ahead of rank 0.

Forwarded output is handled as a terminal would: ``\n`` ends a line and ``\r`` does too (a
progress bar redrawn with ``\r`` is shown as its latest state, once per chunk, instead of
piling up); a line without an end is flushed once it reaches ``MAX_PENDING_CHARS``; only
``stdout`` and ``stderr`` are streams, so what a worker sends cannot grow the hub's memory.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .display import Display
from .probe import MonitorLink
from .records import KINDS, problem
from .sinks import MlflowSink, RunLog, TensorBoardSink
from .stragglers import StragglerDetector

if TYPE_CHECKING:
    from ..ps.transport.base import Endpoint

log = logging.getLogger(__name__)

#: refused records logged at WARNING per worker; later ones at DEBUG, so a faulty worker cannot flood the log
WARN_REFUSED = 5
#: a line longer than this without a line end is shown in pieces of this size
MAX_PENDING_CHARS = 1 << 20
_LINE_END = re.compile(r"\r\n|\n|\r")
#: what the hub adds up over a worker's failed attempts
_ATTEMPT_COUNTS = ("steps", "samples", "lost_steps", "lost_samples")
_RATES = (
    "samples_per_s",
    "loss",
    "data_frac",
    "compute_frac",
    "comm_frac",
    "net_sent_per_s",
    "net_recv_per_s",
)


class MonitorHub:
    """Receives the workers' records while a job runs; a context manager around the job.

    Args:
        world_size: workers in the job (for straggler scores and the display).
        config: the job's settings, for the run log's header and MLflow's parameters.
        run_dir: where ``run.jsonl`` (and ``tensorboard/``) go; None: no run log.
        display: show live progress on the terminal (a rich display on a terminal, a line
            every 15 s otherwise); False: quiet.
        tensorboard: also write TensorBoard event files (needs ``run_dir``).
        mlflow: an MLflow tracking URI to log the run to.
        mlflow_run_id: log into this existing run at ``mlflow`` (left running: its creator ends
            it) instead of a new one.
        host: the address to listen on (the driver's, as executors reach it).
        tls: encrypt the workers' connections (as the job's parameter server does with ``tls=True``).
        comm_is_own: the workers' communication waits for no peer (asynchronous strategies), so a
            worker communicating longer than the others is slow on its own link.
        on_epoch: called with each epoch's results (once per epoch; a listener that raises is
            logged, never fails the job); when it returns True the job is asked to stop
            after that epoch (:attr:`stop_after`, the answer to the workers' questions).

    An asynchronous job sets ``server_metrics`` to its parameter server's ``metrics()``. Server
    tasks on the executors (``servers=K``) report their own figures as ``server`` records, kept
    by shard in ``servers`` and written to the run log as they come.
    """

    def __init__(
        self,
        *,
        world_size: int,
        config: dict[str, Any],
        run_dir: str | None = None,
        display: bool = True,
        tensorboard: bool = False,
        mlflow: str | None = None,
        mlflow_run_id: str | None = None,
        interval_s: float = 2.0,
        host: str = "127.0.0.1",
        title: str = "sparkdp",
        tls: bool = False,
        comm_is_own: bool = False,
        on_epoch: Callable[[dict[str, Any]], bool | None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._on_epoch = on_epoch
        #: the epoch after which the listener asked the job to stop (a pruned trial), or None
        self.stop_after: int | None = None
        self.server_metrics: Callable[[], dict[str, Any]] | None = None
        self._summarised = False  # finish() wrote the summary: the last record of the run log
        self.started = time.time()
        self.latest: dict[int, dict[str, Any]] = {}
        #: per worker, the steps and samples of its attempts that failed (recovery redid that work)
        self.failed_attempts: dict[int, dict[str, int]] = {}
        self.epochs: list[dict[str, Any]] = []
        #: the latest record of each parameter-server task, by shard
        self.servers: dict[int, dict[str, Any]] = {}
        self.detector = StragglerDetector(world_size, comm_is_own=comm_is_own)
        self._lock = threading.Lock()
        self._lines: dict[tuple[int, str], str] = {}
        #: per worker, how many of its records were refused (``sparkdp.monitor.records``)
        self.refused: dict[int, int] = {}
        self.sinks: list[Any] = []
        if run_dir is not None:
            self.sinks.append(RunLog(run_dir, {"config": config, "world_size": world_size}))
        if tensorboard:
            if run_dir is None:
                from ..errors import ConfigError

                raise ConfigError("TensorBoard logs need an output directory: give --out DIR (run_dir=).")
            self.sinks.append(TensorBoardSink(run_dir))
        if mlflow:
            params = {k: v for k, v in config.items() if v is not None}
            self.sinks.append(MlflowSink(mlflow, params, run_id=mlflow_run_id))
        self.display = Display(title, world_size, enabled=display)
        self.world_size = world_size
        #: a per-step fault-tolerant job's latest progress from the driver's quorum, or None
        self._quorum: dict[str, Any] | None = None
        self._endpoint: Endpoint | None = None
        self._host, self._tls = host, tls

    # -- lifetime ---------------------------------------------------------------------------
    def __enter__(self) -> MonitorHub:
        from ..ps.transport.tcp import TcpTransport
        from ..ps.transport.tcp_options import TcpOptions

        self._endpoint = TcpTransport(TcpOptions(tls=self._tls)).serve(
            None, host=self._host, reports=self._on_report
        )
        self.display.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(failed=exc_type is not None, error=None if exc is None else f"{type(exc).__name__}: {exc}")

    @property
    def link(self) -> MonitorLink:
        assert self._endpoint is not None, "enter the hub first"
        return MonitorLink(self._endpoint.info, self.interval_s)

    def close(self, failed: bool = False, error: str | None = None) -> None:
        if self._endpoint is None:
            return
        self._endpoint.close()
        self._endpoint = None
        with self._lock:
            for (rank, stream), rest in self._lines.items():
                if rest:
                    self.display.output(f"[rank {rank}] {rest}", stream)
            self._lines.clear()
            if failed:
                self._emit({"type": "failed", "time": time.time(), "error": error})
            if self.server_metrics is not None and not self._summarised:  # a job that ended early:
                self._emit(self._job_record())  # the server's totals, however short it was
            self.display.stop(self.whole_job(), self.epochs)
            for sink in self.sinks:
                try:
                    sink.close()
                except Exception:  # a sink that fails to close must not hide the job's result
                    log.warning("closing %s failed", type(sink).__name__, exc_info=True)

    def server_totals(self) -> dict[str, Any] | None:
        """The parameter server's figures now (pushes, staleness, bytes), or None without one."""
        return None if self.server_metrics is None else dict(self.server_metrics())

    def finish(self, summary: dict[str, Any]) -> None:
        """The job's end: one ``summary`` record (what ``sparkdp report`` tabulates)."""
        with self._lock:
            if self.server_metrics is not None:  # the server's totals, however short the job was,
                self._emit(self._job_record())  # before the summary, which stays the last record
            self._emit({"type": "summary", "time": time.time(), **summary})
            self._summarised = True

    def on_restart(self, kind: str, record: dict[str, Any]) -> None:
        """The job controller restarted the workers after a ``kind`` ("failure" or "preemption"):
        one ``restart`` record in the run log (the job controller's callback)."""
        with self._lock:
            self._emit({"type": "restart", "kind": kind, "time": time.time(), **record})

    def quorum_progress(self, progress: dict[str, Any]) -> None:
        """A per-step fault-tolerant job's progress from the driver's quorum: ``steps`` and
        ``samples`` committed, ``quorum`` (its members) of ``workers`` (and ``total_steps``,
        ``steps_per_epoch``, ``epochs``). One ``job`` record, its ``samples_per_s`` over the rows
        committed since the previous one, and the progress line's figures."""
        now = time.time()
        with self._lock:
            before = self._quorum if self._quorum is not None and "samples" in self._quorum else None
            rate = None
            if before is not None and now > before["time"]:
                rate = max(progress["samples"] - before["samples"], 0) / (now - before["time"])
            self._quorum = record = {
                "type": "job",
                "time": now,
                "elapsed_s": now - self.started,
                "samples_per_s": rate,
                **progress,
            }
            self._emit(record)
            self.display.quorum(record)

    def membership(self, record: dict[str, Any], quorum: int) -> None:
        """A leave or join of a per-step fault-tolerant job (the quorum's ``membership`` record),
        after which the quorum has ``quorum`` members: one ``membership`` record in the run log,
        and the progress line's quorum size."""
        with self._lock:
            self._emit({**record, "type": "membership", "quorum": quorum})
            before = self._quorum or {"steps": record["step"]}  # (a change before the first progress)
            self._quorum = {**before, "quorum": quorum, "workers": self.world_size}
            self.display.quorum(self._quorum)

    # -- records ----------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """Whether the epoch listener asked the job to stop."""
        return self.stop_after is not None

    def _on_report(self, worker: int, record: dict[str, Any]) -> dict[str, Any]:
        """Take one record; the answer to a worker's question (``ASK``): whether to stop after
        the record's epoch (after any, for a record without a valid one)."""
        self._take(worker, record)
        epoch = record.get("epoch")
        if self.stop_after is None or (type(epoch) is int and epoch < self.stop_after):
            return {"stop": False}
        return {"stop": True}

    def _take(self, worker: int, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind not in KINDS:
            log.debug("ignoring a monitoring record of unknown type %r from worker %d", kind, worker)
            return
        wrong = problem(record)
        if (
            wrong is not None
        ):  # refused before anything is kept, so it cannot break the worker's later records
            with self._lock:
                self.refused[worker] = count = self.refused.get(worker, 0) + 1
            log.log(
                logging.WARNING if count <= WARN_REFUSED else logging.DEBUG,
                "refused monitoring record %d from worker %d: %s",
                count,
                worker,
                wrong,
            )
            return
        if kind == "stop_query":
            return  # (only the answer matters)
        record = {**record, "rank": worker}  # the authenticated id, not the claimed one
        if self._keep(kind, worker, record) and kind == "epoch" and self._on_epoch is not None:
            try:  # (outside the lock: a search's pruner may take its time)
                if self._on_epoch(record) and self.stop_after is None:
                    self.stop_after = record["epoch"]
            except Exception:  # a listener's failure must not fail the job
                log.warning("the epoch listener failed on %s", record, exc_info=True)

    def _keep(self, kind: str, worker: int, record: dict[str, Any]) -> bool:
        """Keep one record (under the lock); False for an epoch a retried worker repeated."""
        with self._lock:
            if kind == "metrics":
                self._metrics(record)
            elif kind == "output":
                self._output(worker, record.get("stream", "stdout"), record["text"])
            elif kind == "server":
                self.servers[record["shard"]] = record
                self._emit(record)
            elif kind == "epoch":
                if self.epochs and record.get("epoch", 0) <= self.epochs[-1].get("epoch", 0):
                    # a retried worker redoing an epoch already reported: kept in the run log, not shown again
                    self._emit({**record, "repeated": True})
                    return False
                self.epochs.append(record)
                self._emit(record)
                self.display.epoch(record)
            else:
                self.display.epoch_start(record)
                self._emit(record)
        return True

    def _metrics(self, record: dict[str, Any]) -> None:
        rank = record["rank"]
        before = self.latest.get(rank)
        if before is not None and record.get("steps", 0) < before.get("steps", 0):
            # the worker restarted (recovery): its counters began again; the ended attempt's stay counted
            ended = self.failed_attempts.setdefault(rank, dict.fromkeys(_ATTEMPT_COUNTS, 0))
            ended["steps"] += before.get("steps", 0)
            ended["samples"] += before.get("samples", 0)
            # lost: what the attempt did after its last checkpoint (all of it without one)
            ended["lost_steps"] += before.get("steps", 0) - before.get("saved_steps", 0)
            ended["lost_samples"] += before.get("samples", 0) - before.get("saved_samples", 0)
            before = None
        if before is not None and record.get("samples") == before.get("samples"):
            # no batch since (a worker's last record, or one evaluating): it trains no rows now (a
            # finished asynchronous worker must not add to the job's samples/s), the rest as it was
            record.update(
                {k: before[k] for k in _RATES if k in before},
                samples_per_s=0.0,
                **({"tokens_per_s": 0.0} if "tokens" in record else {}),
            )
        elif before is not None:
            dt = max(record["time"] - before["time"], 1e-9)
            rows = record["samples"] - before["samples"]
            spent = {k: record[k] - before[k] for k in ("data_s", "compute_s", "comm_s")}
            total = sum(spent.values()) or 1e-9
            record.update(
                samples_per_s=rows / dt,
                loss=(record["loss_sum"] - before["loss_sum"]) / rows
                if rows and "loss_sum" in record and "loss_sum" in before
                else before.get("loss"),
                data_frac=spent["data_s"] / total,
                compute_frac=spent["compute_s"] / total,
                comm_frac=spent["comm_s"] / total,
                net_sent_per_s=max(record["net_sent"] - before["net_sent"], 0) / dt,
                net_recv_per_s=max(record["net_recv"] - before["net_recv"], 0) / dt,
            )
            if "tokens" in record and "tokens" in before:
                record["tokens_per_s"] = max(record["tokens"] - before["tokens"], 0) / dt
        self.latest[rank] = record
        self._emit(record)
        for text in self.detector.update(record):
            log.warning("%s", text)
            self._emit({"type": "warning", "time": time.time(), "message": text})
            self.display.warning(text)
        if rank == min(self.latest):
            self._emit(self._job_record())
        self.display.update(self.latest, self.detector.scores)

    def whole_job(self) -> dict[int, dict[str, Any]]:
        """Every worker's last record with its steps and samples over all attempts; those of
        failed attempts also apart (``failed_steps``/``failed_samples``), and of them the work
        done after each failed attempt's last checkpoint, which recovery redid
        (``lost_steps``/``lost_samples``)."""
        out = {}
        for rank, record in self.latest.items():
            failed = self.failed_attempts.get(rank, dict.fromkeys(_ATTEMPT_COUNTS, 0))
            out[rank] = {
                **record,
                "steps": record.get("steps", 0) + failed["steps"],
                "samples": record.get("samples", 0) + failed["samples"],
                **{f"failed_{k}": failed[k] for k in ("steps", "samples")},
                "lost_steps": failed["lost_steps"],
                "lost_samples": failed["lost_samples"],
            }
        return out

    def _job_record(self) -> dict[str, Any]:
        rates = [r["samples_per_s"] for r in self.latest.values() if "samples_per_s" in r]
        token_rates = [r["tokens_per_s"] for r in self.latest.values() if "tokens_per_s" in r]
        job: dict[str, Any] = {
            "type": "job",
            "time": time.time(),
            "elapsed_s": time.time() - self.started,
            "samples_per_s": sum(rates) if rates else None,
            "samples": sum(r["samples"] for r in self.latest.values()),
            **({"tokens_per_s": sum(token_rates)} if token_rates else {}),
        }
        if self.server_metrics is not None:
            server = self.server_metrics()
            job.update(
                pushes=server.get("pushes_applied"),
                staleness=server.get("staleness"),
                ps_bytes_in=server.get("bytes_in"),
                ps_bytes_out=server.get("bytes_out"),
            )
            self.display.server(server, job["elapsed_s"])
        return job

    def _output(self, rank: int, stream: str, text: str) -> None:
        pending = self._lines.get((rank, stream), "") + text
        pieces = _LINE_END.split(pending)
        ends = _LINE_END.findall(pending)
        rest = pieces.pop()
        shown: list[tuple[str, str]] = []
        for line, end in zip(pieces, ends):
            if end == "\r" and not line:
                continue  # a redraw's leading carriage return ends no visible line
            if shown and shown[-1][1] == "\r":
                shown.pop()  # a redraw replaces the line it was drawn over: show only its latest state
            shown.append((line, end))
        while len(rest) >= MAX_PENDING_CHARS:  # no line end yet: show what a terminal would have shown
            shown.append((rest[:MAX_PENDING_CHARS], ""))
            rest = rest[MAX_PENDING_CHARS:]
        self._lines[(rank, stream)] = rest
        for line, _end in shown:
            self.display.output(f"[rank {rank}] {line}", stream)

    def _emit(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            try:
                sink.write(record)
            except Exception as exc:  # monitoring must not fail the job
                log.warning("%s could not write a record: %s", type(sink).__name__, exc)
