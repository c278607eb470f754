"""The driver's terminal while a job runs: a live rich table on a terminal, a progress line
every few seconds otherwise (logs, CI), epoch results and warnings as they come, and a
summary table at the end. Nothing at all when disabled (``--quiet``, ``show_progress=False``)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.live import Live


def _eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Display:
    def __init__(
        self,
        title: str,
        world_size: int,
        *,
        enabled: bool = True,
        line_every_s: float = 15.0,
        stream: Any = None,
    ) -> None:
        self.title, self.world_size, self.enabled = title, world_size, enabled
        self.line_every_s = line_every_s
        self.stream = stream or sys.stderr
        self.live: Live | None = None
        self.epochs_total: int | None = None
        self.steps_per_epoch: int | None = None
        self.first_seen: tuple[float, float] | None = None  # (time, fraction done) of the first report
        self.last_line = 0.0
        self.server_line = ""
        self._latest: dict[int, dict[str, Any]] = {}
        self._scores: dict[int, dict[str, float]] = {}
        #: a per-step fault-tolerant job's progress from the driver's quorum (its workers report nothing here)
        self._quorum: dict[str, Any] | None = None

    def start(self) -> None:
        if not self.enabled or not getattr(self.stream, "isatty", lambda: False)():
            return
        from rich.console import Console
        from rich.live import Live

        self.live = Live(
            get_renderable=self._renderable,
            console=Console(file=self.stream),
            refresh_per_second=2,
            transient=True,
        )
        self.live.start()

    # -- events from the hub ----------------------------------------------------------------
    def epoch_start(self, record: dict[str, Any]) -> None:
        if record.get("rank") == 0 or self.epochs_total is None:
            self.epochs_total = record.get("epochs") or self.epochs_total
            self.steps_per_epoch = record.get("steps_per_epoch") or self.steps_per_epoch

    def update(self, latest: dict[int, dict[str, Any]], scores: dict[int, dict[str, float]]) -> None:
        self._latest, self._scores = latest, scores
        self._tick()

    def quorum(self, record: dict[str, Any]) -> None:
        """The quorum's progress (``steps`` committed, ``samples_per_s``, ``quorum`` of ``workers``,
        and ``steps_per_epoch`` and ``epochs`` when known): the headline of a per-step
        fault-tolerant job, whose workers send no metrics."""
        self._quorum = record
        self.steps_per_epoch = record.get("steps_per_epoch") or self.steps_per_epoch
        self.epochs_total = record.get("epochs") or self.epochs_total
        self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        done = self.progress()[0]
        # (the quorum's first step, not its start: its progress is told while Spark starts the tasks)
        if self.first_seen is None and done is not None and (self._latest or done > 0):
            self.first_seen = (now, done)
        if self.enabled and self.live is None and now - self.last_line >= self.line_every_s:
            self.last_line = now
            self._print(self.headline())

    def epoch(self, record: dict[str, Any]) -> None:
        parts = [f"epoch {record.get('epoch')}"]
        for key in ("loss", "test_loss", "test_perplexity", "test_accuracy"):
            if isinstance(record.get(key), (int, float)):
                parts.append(f"{key} {record[key]:.4f}")
        if isinstance(record.get("epoch_time_s"), (int, float)):
            parts.append(f"({record['epoch_time_s']:.1f} s)")
        self._print("  ".join(parts))

    def warning(self, text: str) -> None:
        self._print(f"warning: {text}")

    def server(self, metrics: dict[str, Any], elapsed_s: float) -> None:
        staleness = metrics.get("staleness") or {}
        pushes = sum(staleness.values())
        mean = sum(int(k) * v for k, v in staleness.items()) / pushes if pushes else 0.0
        applied = metrics.get("pushes_applied") or 0
        self.server_line = (
            f"parameter server: {applied:,} pushes ({applied / max(elapsed_s, 1e-9):.1f}/s), "
            f"mean staleness {mean:.2f}, max {max(map(int, staleness), default=0)}"
        )

    def output(self, line: str, stream: str) -> None:
        if self.live is not None:
            self.live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            (sys.stderr if stream == "stderr" else sys.stdout).write(line + "\n")

    def stop(self, latest: dict[int, dict[str, Any]], epochs: list[dict[str, Any]]) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.enabled and latest:
            from rich.console import Console

            Console(file=self.stream).print(self.summary_table(latest))
        if self.server_line:  # (the server's totals at the end, not at the last progress interval)
            self._print(self.server_line)

    # -- rendering --------------------------------------------------------------------------
    def _print(self, text: str) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def progress(self) -> tuple[float | None, int, int]:
        """(fraction of the job done, epoch, step) from the lowest rank's latest record, or else
        from the quorum's committed steps."""
        if self._latest:
            head = self._latest[min(self._latest)]
            epoch, step = int(head.get("epoch", 1)), int(head.get("step", 0))
        elif self._quorum is not None and self.steps_per_epoch:
            steps = int(self._quorum.get("steps", 0))
            epoch = steps // self.steps_per_epoch + 1
            if self.epochs_total:  # (the last step ends the last epoch, not one past it)
                epoch = min(epoch, self.epochs_total)
            step = steps - (epoch - 1) * self.steps_per_epoch
        else:
            return None, 0, 0
        if not self.epochs_total or not self.steps_per_epoch:
            return None, epoch, step
        done = ((epoch - 1) * self.steps_per_epoch + step) / (self.epochs_total * self.steps_per_epoch)
        return min(done, 1.0), epoch, step

    def headline(self) -> str:
        done, epoch, step = self.progress()
        rates = [r["samples_per_s"] for r in self._latest.values() if "samples_per_s" in r]
        quorum = self._quorum
        if not rates and quorum is not None and quorum.get("samples_per_s") is not None:
            rates = [quorum["samples_per_s"]]
        tokens = [r["tokens_per_s"] for r in self._latest.values() if "tokens_per_s" in r]
        losses = [r["loss"] for r in self._latest.values() if isinstance(r.get("loss"), (int, float))]
        eta = None
        if done is not None and self.first_seen is not None and done > self.first_seen[1]:
            # the pace since the first report (which came after Spark's start-up)
            seen, done_then = self.first_seen
            eta = (time.monotonic() - seen) / (done - done_then) * (1 - done)
        of_epochs = f"/{self.epochs_total}" if self.epochs_total else ""
        of_steps = f"/{self.steps_per_epoch}" if self.steps_per_epoch else ""
        text = (
            f"{self.title}: epoch {epoch}{of_epochs} step {step}{of_steps}"
            + (f" ({100 * done:.0f}%)" if done is not None else "")
            + (f", loss {sum(losses) / len(losses):.4f}" if losses else "")
            + (f", {sum(rates):,.0f} samples/s" if rates else "")
            + (f", {sum(tokens):,.0f} tokens/s" if tokens else "")
            + (f", quorum {quorum['quorum']}/{quorum['workers']}" if quorum is not None else "")
            + f", ETA {_eta(eta)}"
        )
        return text + (f"; {self.server_line}" if self.server_line else "")

    def _renderable(self):
        from rich.console import Group
        from rich.text import Text

        if not self._latest and self._quorum is not None:  # no worker reports in this job: no table
            return Text(self.headline())
        return Group(Text(self.headline()), self.worker_table(self._latest, live=True))

    def worker_table(self, latest: dict[int, dict[str, Any]], live: bool):
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for name in (
            "worker",
            "epoch",
            "step",
            "samples/s",
            "loss",
            "data",
            "compute",
            "comm",
            "CPU",
            "RSS MB",
            "net MB/s out/in",
            "score",
        ):
            table.add_column(name, justify="right")
        for rank in sorted(latest):
            r = latest[rank]
            score = self._scores.get(rank, {}).get("relative")
            table.add_row(
                self.worker_label(rank),
                str(r.get("epoch", "")),
                str(r.get("step", "")),
                f"{r['samples_per_s']:,.0f}" if "samples_per_s" in r else "",
                f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "",
                *(f"{100 * r[k]:.0f}%" if k in r else "" for k in ("data_frac", "compute_frac", "comm_frac")),
                f"{r.get('cpu_percent', 0):.0f}%",
                f"{r.get('rss_bytes', 0) / 2**20:,.0f}",
                (
                    f"{r['net_sent_per_s'] / 1e6:.1f}/{r['net_recv_per_s'] / 1e6:.1f}"
                    if "net_sent_per_s" in r
                    else ""
                ),
                f"{score:.2f}" if score is not None else "",
            )
        return table

    def worker_label(self, rank: int) -> str:
        """``R`` for Spark worker R; ``R.k`` for the k-th process it started (``train.children``)."""
        if rank < self.world_size:
            return str(rank)
        return f"{rank % self.world_size}.{rank // self.world_size - 1}"

    def summary_table(self, latest: dict[int, dict[str, Any]]):
        """Per worker over the whole job (every attempt): steps, rows, time split, memory."""
        from rich.table import Table

        table = Table(title=f"{self.title}: per worker", box=None, pad_edge=False)
        redone = any(r.get("failed_steps") for r in latest.values())  # some attempt failed and was recovered
        for name in (
            "worker",
            "host",
            "steps",
            "samples",
            *(("steps lost",) if redone else ()),  # since the failed attempts' last checkpoints
            "data",
            "compute",
            "comm",
            "RSS MB",
            "MB sent",
        ):
            table.add_column(name, justify="right")
        for rank in sorted(latest):
            r = latest[rank]
            spent = sum(r.get(k, 0.0) for k in ("data_s", "compute_s", "comm_s")) or 1e-9
            failed = (f"{r.get('lost_steps', 0):,}",) if redone else ()
            table.add_row(
                self.worker_label(rank),
                str(r.get("host", "")),
                f"{r.get('steps', 0):,}",
                f"{r.get('samples', 0):,}",
                *failed,
                *(f"{100 * r.get(k, 0.0) / spent:.0f}%" for k in ("data_s", "compute_s", "comm_s")),
                f"{r.get('rss_bytes', 0) / 2**20:,.0f}",
                f"{r.get('bytes_sent', 0) / 1e6:,.1f}",
            )
        return table
