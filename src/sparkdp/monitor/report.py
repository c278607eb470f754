"""``sparkdp report``: draw finished (or crashed) runs from their run logs, on shared axes.

Reads each ``RUN_DIR/run.jsonl`` (``sparkdp.monitor.sinks.RunLog``); a last line cut short by
a crash is skipped. Writes PNGs with matplotlib and a Markdown table of the runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .sinks import RUN_LOG


@dataclass
class Run:
    name: str
    header: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == kind]

    @property
    def start(self) -> float:
        return float(self.header.get("time", 0.0))

    @property
    def summary(self) -> dict[str, Any] | None:
        found = self.of("summary")
        return found[-1] if found else None

    def label(self) -> str:
        config = self.header.get("config", {})
        return f"{self.name} ({config.get('strategy', '?')}, {config.get('workers', '?')} workers)"


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    path = Path(run_dir) / RUN_LOG
    if not path.is_file():
        raise ConfigError(
            f"{str(run_dir)!r} is not a sparkdp run: it has no {RUN_LOG}. Give the --out directory "
            "of a `sparkdp train` run (or the run_dir= of sparkdp.fit)."
        )
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the last line of a run that crashed while writing it
            raise ConfigError(f"{path}: line {number} is not JSON; the run log is damaged.") from None
    if not records or records[0].get("type") != "header":
        raise ConfigError(f"{path} does not start with a sparkdp run header; it is not a run log.")
    return Run(Path(run_dir).resolve().name, records[0], records[1:])


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: Path, name: str) -> Path:
    """``fig`` laid out, written to ``out / name`` at 110 dpi and closed; the path."""
    path = out / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def write_report(runs: list[Run], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the plots and ``summary.md`` for ``runs`` into ``out_dir``; return the files."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []

    for metric, title in (("loss", "training loss"), ("test_accuracy", "test accuracy")):
        fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(11, 4))
        for run in runs:
            epochs = [
                e
                for e in run.of("epoch")
                if isinstance(e.get(metric), (int, float)) and not e.get("repeated")
            ]
            if metric == "loss":  # the training loss is reported live, between epochs too
                live = [r for r in run.of("metrics") if r.get("rank") == 0 and "loss" in r]
                by_time.plot(
                    [r["time"] - run.start for r in live], [r["loss"] for r in live], label=run.label()
                )
            else:
                by_time.plot(
                    [e["time"] - run.start for e in epochs],
                    [e[metric] for e in epochs],
                    marker="o",
                    label=run.label(),
                )
            by_epoch.plot(
                [e["epoch"] for e in epochs], [e[metric] for e in epochs], marker="o", label=run.label()
            )
        by_time.set(xlabel="wall time (s)", ylabel=title, title=f"{title} against wall time")
        by_epoch.set(xlabel="epoch", ylabel=title, title=f"{title} against epochs")
        for ax in (by_time, by_epoch):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        files.append(save_figure(fig, out, f"{metric}.png"))

    files.append(save_figure(throughput_figure(runs), out, "throughput.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for run in runs:
        staleness = next((j["staleness"] for j in reversed(run.of("job")) if j.get("staleness")), None)
        if staleness:
            taus = sorted(int(k) for k in staleness)
            width = 0.8 / len(runs)
            ax.bar(
                [t + width * runs.index(run) for t in taus],
                [staleness[str(t)] for t in taus],
                width=width,
                label=run.label(),
                alpha=0.8,
            )
            drawn = True
    ax.set(
        xlabel="staleness τ (updates since the worker's pull)", ylabel="pushes", title="staleness of pushes"
    )
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no asynchronous runs", ha="center", va="center", transform=ax.transAxes)
    files.append(save_figure(fig, out, "staleness.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh([run.label() for run in runs], [(bytes_per_sample(run) or 0.0) / 1e3 for run in runs])
    ax.set(xlabel="kB sent per training sample (all workers)", title="bytes on the wire per sample")
    files.append(save_figure(fig, out, "bytes_per_sample.png"))

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for run in runs:
        for rank in sorted({r["rank"] for r in run.of("metrics")}):
            mine = [r for r in run.of("metrics") if r["rank"] == rank]
            t = [r["time"] - run.start for r in mine]
            label = f"{run.name} worker {rank}"
            axes[0].plot(t, [r.get("cpu_percent", 0) for r in mine], label=label)
            axes[1].plot(t, [r.get("rss_bytes", 0) / 2**20 for r in mine], label=label)
            axes[2].plot(
                t,
                [(r.get("net_sent_per_s", 0) + r.get("net_recv_per_s", 0)) / 1e6 for r in mine],
                label=label,
            )
    for ax, ylabel, title in zip(
        axes,
        ("CPU % (100 = one core)", "resident memory (MB)", "host network (MB/s)"),
        ("CPU per worker", "memory per worker", "network in + out per worker's host"),
    ):
        ax.set(xlabel="wall time (s)", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        if ax.lines:  # (a fault_tolerance="step" run's workers report no metrics)
            ax.legend(fontsize=7)
    files.append(save_figure(fig, out, "system.png"))

    summary = out / "summary.md"
    summary.write_text(summary_table(runs), encoding="utf-8")
    files.append(summary)
    return files


def membership(run: Run) -> list[dict[str, Any]]:
    """A per-step fault-tolerant run's leaves and joins: the run log's ``membership`` records as
    they came, or else its summary's list (the same records, kept at the end)."""
    live = run.of("membership")
    if live:
        return live
    listed = (run.summary or {}).get("membership")
    return [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []


def throughput_figure(runs: list[Run]):
    """The job's samples/s against wall time, each run's leaves (dashed) and joins (dotted)
    marked by vertical lines in its colour at the time the quorum recorded them."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    marked = False
    for run in runs:
        jobs = [j for j in run.of("job") if j.get("samples_per_s") is not None]
        (line,) = ax.plot(
            [j["time"] - run.start for j in jobs], [j["samples_per_s"] for j in jobs], label=run.label()
        )
        for kind, style in (("leave", "--"), ("join", ":")):
            times = [
                r["time"] - run.start
                for r in membership(run)
                if r.get("kind") == kind and isinstance(r.get("time"), (int, float))
            ]
            for n, t in enumerate(times):
                label = f"{run.name}: worker {'left' if kind == 'leave' else 'joined'}" if n == 0 else None
                ax.axvline(t, color=line.get_color(), linestyle=style, alpha=0.7, label=label)
                marked = True
    title = "throughput, leaves and joins of the quorum marked" if marked else "throughput"
    ax.set(xlabel="wall time (s)", ylabel="samples/s (all workers)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def bytes_per_sample(run: Run) -> float | None:
    last = {r["rank"]: r for r in run.of("metrics")}  # every rank's latest record
    samples = sum(r.get("samples", 0) for r in last.values())
    return sum(r.get("bytes_sent", 0) for r in last.values()) / samples if samples else None


def memory_cell(memory: Any) -> str:
    """The largest worker's model-state bytes and peak RSS, in MB ("–" for runs without them)."""
    if not isinstance(memory, list) or not memory:
        return "–"
    state = max(float(m.get("model_state_bytes", 0)) for m in memory)
    rss = max(float(m.get("peak_rss_bytes", 0)) for m in memory)
    return f"{state / 2**20:,.1f} / {rss / 2**20:,.0f}"


def summary_table(runs: list[Run]) -> str:
    rows = [
        "| run | strategy | workers | epochs | final test accuracy | wall time (s) | samples/s | "
        "bytes sent per sample | model state / peak RSS (MB, largest worker) | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        config, s = run.header.get("config", {}), run.summary or {}
        epochs = [e for e in run.of("epoch") if not e.get("repeated")]
        accuracy = s.get("test_accuracy") or next(
            (e["test_accuracy"] for e in reversed(epochs) if "test_accuracy" in e), None
        )
        status = "finished" if run.summary else ("failed" if run.of("failed") else "incomplete")
        bps = bytes_per_sample(run)
        rows.append(
            f"| {run.name} | {config.get('strategy', '?')} | {config.get('workers', '?')} | "
            f"{len(epochs)}/{config.get('epochs', '?')} | "
            + (f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "–")
            + " | "
            + (f"{s['wall_s']:.1f}" if "wall_s" in s else "–")
            + " | "
            + (f"{s['samples_per_s']:,.0f}" if s.get("samples_per_s") else "–")
            + " | "
            + (f"{bps:,.0f}" if bps is not None else "–")
            + f" | {memory_cell(s.get('memory'))} | {status} |"
        )
    return "\n".join(rows) + "\n"
