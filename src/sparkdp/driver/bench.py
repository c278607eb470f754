"""``sparkdp bench``: a matrix of strategies × worker counts × seeds on a named workload.

Every run is a real :func:`sparkdp.fit` on Spark; each writes one JSON line as soon as it
ends (so an interrupted matrix keeps what it measured) with stable keys — ``workload``,
``strategy``, ``workers``, ``seed``, ``test_accuracy`` (the mean of the last three
evaluations), ``wall_s``, ``samples_per_s``, ``bytes_per_sample``, ``time_to_target_s`` —
plus the accuracy curve, CPU utilisation and, for asynchronous rules, the server's
staleness histogram.  :func:`summarise` turns the lines into a table (mean ± sd over seeds).

Workloads: ``fashion-mnist-cnn`` (the 2-conv CNN), ``fashion-mnist-mlp`` and ``comm-bound``
(a 4.3 M-parameter MLP on 64 synthetic features with 8 rows per step: little compute per
byte moved, for communication studies).
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import key_value
from ..errors import ConfigError
from ..models import build_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workload:
    name: str
    build_model: Callable[[], nn.Module]
    load: Callable[[int | None], tuple[Any, Any]]  # limit -> (train, test), the same for every seed
    batch: int
    lr: float
    target: float  # the test accuracy "time to target" waits for
    samples_per_s_guess: float  # on this project's 2-core reference machine, 2 workers (for estimates)


def _fashion(limit: int | None):
    from ..data.datasets import dataset_tensors, load_dataset

    return dataset_tensors(load_dataset("fashion-mnist", limit=limit))


def _synthetic(limit: int | None):
    """10 Gaussian clusters in 64 dimensions (fixed centres, so every seed sees the same task)."""
    from ..data.tensors import TensorData

    gen = torch.Generator().manual_seed(1234)
    centres = torch.randn(10, 64, generator=gen) * 0.6
    rows = limit or 20_000

    def draw(n: int, salt: int) -> TensorData:
        g = torch.Generator().manual_seed(salt)
        y = torch.randint(0, 10, (n,), generator=g)
        return TensorData(centres[y] + torch.randn(n, 64, generator=g), y)

    return draw(rows, 1), draw(max(rows // 5, 1000), 2)


def _comm_bound_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)
    )


WORKLOADS = {
    w.name: w
    for w in (
        Workload("fashion-mnist-cnn", partial(build_model, "cnn"), _fashion, 64, 0.05, 0.85, 1300.0),
        Workload("fashion-mnist-mlp", partial(build_model, "mlp"), _fashion, 64, 0.05, 0.80, 9000.0),
        Workload("comm-bound", _comm_bound_model, _synthetic, 8, 0.02, 0.90, 900.0),
    )
}


@dataclass(frozen=True)
class StrategyChoice:
    name: str
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}({extra})" if extra else self.name

    @classmethod
    def parse(cls, text: str) -> StrategyChoice:
        """``name`` or ``name:key=value:key=value`` (values as JSON, else strings)."""
        from ..strategies import STRATEGIES

        name, *pairs = re.split(r":(?=[A-Za-z_][A-Za-z0-9_]*=)", text)  # JSON values may hold colons
        if ":" in name:
            name, bad = name.split(":", 1)
            pairs.insert(0, bad)
        if name not in STRATEGIES:
            raise ConfigError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES.available())}")
        for pair in pairs:
            if pair.find("=") < 1:  # no '=', or no key before it
                raise ConfigError(f"strategy option {pair!r} in {text!r} must be KEY=VALUE")
        return cls(name, dict(key_value(pair) for pair in pairs))


def workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


@contextmanager
def _slowed(slow: str | None):
    """``RANKS:FACTOR`` -> those workers' steps take FACTOR times as long (``train/faults.py``)."""
    from ..train.faults import ENV

    if not slow:
        yield
        return
    ranks, _, factor = slow.partition(":")
    previous = os.environ.get(ENV)
    os.environ[ENV] = f"slow:rank={ranks}:step=1:factor={factor or 2}"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous


def _cpu_busy() -> tuple[float, float]:
    import psutil

    t = psutil.cpu_times()
    return time.perf_counter(), t.user + t.system + getattr(t, "nice", 0.0)


def run_one(
    work: Workload,
    choice: StrategyChoice,
    workers: int,
    seed: int,
    *,
    epochs: int,
    data: tuple[Any, Any],
    spark: Any,
    slow: str | None = None,
) -> dict[str, Any]:
    """One training run and its record (see the module docstring for the keys)."""
    from .api import fit

    train, test = data
    torch.manual_seed(seed)
    model = work.build_model()
    started, busy = _cpu_busy()
    with _slowed(slow):
        result = fit(
            model,
            train,
            eval_data=test,
            strategy=choice.name,
            strategy_options=dict(choice.options),
            workers=workers,
            epochs=epochs,
            batch_size=work.batch,
            seed=seed,
            optimizer_options={"lr": work.lr},
            spark=spark,
            show_progress=False,
        )
    ended, busy_end = _cpu_busy()
    accuracy = [h["test_accuracy"] for h in result.history if "test_accuracy" in h]
    elapsed, to_target = 0.0, None
    for h in result.history:
        elapsed += h["epoch_time_s"]
        if to_target is None and h.get("test_accuracy", 0.0) >= work.target:
            to_target = elapsed
    details = result.details
    if "per_worker" in details:  # asynchronous: pushes and pulls, each crossing the wire once
        wire = sum(w.get("bytes_sent", 0) + w.get("bytes_recv", 0) for w in details["per_worker"])
    else:  # synchronous: every rank sends what rank 0 sent (each byte sent is received once)
        wire = details.get("comm", {}).get("bytes_sent", 0) * result.workers
    return {
        "workload": work.name,
        "strategy": choice.label,
        "strategy_name": choice.name,
        "options": choice.options,
        "workers": result.workers,
        "seed": seed,
        "epochs": epochs,
        "test_accuracy": statistics.fmean(accuracy[-3:]) if accuracy else None,
        "final_test_accuracy": accuracy[-1] if accuracy else None,
        "accuracy_history": accuracy,
        "wall_s": result.wall_s,
        "train_time_s": result.train_time_s,
        "samples_per_s": result.samples_per_s,
        "bytes_per_sample": wire / result.samples if result.samples else None,
        "time_to_target_s": to_target,
        "target": work.target,
        "cpu_util": (busy_end - busy) / max((ended - started) * (os.cpu_count() or 1), 1e-9),
        "staleness": details.get("server", {}).get("staleness"),
        "slow": slow,
    }


def run_matrix(
    work: Workload,
    choices: Sequence[StrategyChoice],
    worker_counts: Sequence[int],
    seeds: Sequence[int],
    *,
    epochs: int,
    limit: int | None,
    spark: Any,
    out: Path,
    slow: str | None = None,
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every combination, appended to ``out`` (JSON lines) as each run ends; failures recorded, not fatal."""
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    data = work.load(limit)
    for choice in choices:
        for m in worker_counts:
            for seed in seeds:
                try:
                    record = run_one(work, choice, m, seed, epochs=epochs, data=data, spark=spark, slow=slow)
                except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
                    log.exception("run %s x%d seed %d failed", choice.label, m, seed)
                    record = {
                        "workload": work.name,
                        "strategy": choice.label,
                        "workers": m,
                        "seed": seed,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                with out.open("a") as handle:
                    handle.write(json.dumps(record) + "\n")
                records.append(record)
                echo(_one_line(record))
    return records


def _one_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['strategy']:<24} x{r['workers']:<3} seed {r['seed']}: FAILED {r['error']}"
    return (
        f"{r['strategy']:<24} x{r['workers']:<3} seed {r['seed']}: accuracy {r['test_accuracy']:.4f}, "
        f"{r['samples_per_s']:,.0f} samples/s, {r['wall_s']:.1f} s"
    )


def read_records(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()
    ]


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, strategy, workers): mean ± sd accuracy over seeds, medians of the rest."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        if "error" not in r:
            groups.setdefault((r["workload"], r["strategy"], r["workers"]), []).append(r)
    rows = []
    for (name, strategy, workers), runs in groups.items():
        acc_mean, acc_sd = _mean_sd([r["test_accuracy"] for r in runs])
        reached = [r["time_to_target_s"] for r in runs if r.get("time_to_target_s") is not None]
        staleness: dict[str, int] = {}
        for r in runs:
            for tau, n in (r.get("staleness") or {}).items():
                staleness[str(tau)] = staleness.get(str(tau), 0) + n
        rows.append(
            {
                "workload": name,
                "strategy": strategy,
                "workers": workers,
                "seeds": len(runs),
                "accuracy_mean": acc_mean,
                "accuracy_sd": acc_sd,
                "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
                "bytes_per_sample": statistics.median(r["bytes_per_sample"] or 0 for r in runs),
                "time_to_target_s": statistics.median(reached) if reached else None,
                "reached_target": f"{len(reached)}/{len(runs)}",
                "cpu_util": statistics.median(r["cpu_util"] for r in runs),
                "staleness": dict(sorted(staleness.items(), key=lambda kv: int(kv[0]))) or None,
            }
        )
    return rows


def staleness_quantile(histogram: dict[str, int], q: float) -> int:
    """The smallest τ with at least a fraction ``q`` of the pushes at or below it."""
    total, seen = sum(histogram.values()), 0
    for tau, n in sorted(histogram.items(), key=lambda kv: int(kv[0])):
        seen += n
        if seen >= q * total:
            return int(tau)
    return max(int(t) for t in histogram)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| workload | strategy | workers | seeds | test accuracy (mean ± sd) | samples/s | kB/sample | "
        "time to target (s) | reached | CPU | staleness mean / p50 / p90 / p99 / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        st = r["staleness"]
        tau = "—"
        if st:
            mean = sum(int(k) * v for k, v in st.items()) / sum(st.values())
            tau = f"{mean:.2f} / " + " / ".join(str(staleness_quantile(st, q)) for q in (0.5, 0.9, 0.99, 1.0))
        target = "—" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        lines.append(
            f"| {r['workload']} | {r['strategy']} | {r['workers']} | {r['seeds']} | "
            f"{r['accuracy_mean']:.4f} ± {r['accuracy_sd']:.4f} | {r['samples_per_s']:,.0f} | "
            f"{r['bytes_per_sample'] / 1e3:,.1f} | "
            f"{target} | {r['reached_target']} | "
            f"{r['cpu_util']:.0%} | {tau} |"
        )
    return "\n".join(lines) + "\n"


def plot(records: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Accuracy (mean ± sd) and throughput per strategy, and the staleness histograms, in one PNG."""
    from ..monitor.report import pyplot, save_figure

    fig, axes = pyplot().subplots(1, 3, figsize=(16, 4.5))
    labels = [f"{r['strategy']}\nx{r['workers']}" for r in rows]
    axes[0].bar(labels, [r["accuracy_mean"] for r in rows], yerr=[r["accuracy_sd"] for r in rows], capsize=3)
    low = min(r["accuracy_mean"] - r["accuracy_sd"] for r in rows)
    axes[0].set(title="test accuracy (mean ± sd over seeds)", ylim=(max(0.0, low - 0.02), 1.0))
    axes[1].bar(labels, [r["samples_per_s"] for r in rows])
    axes[1].set(title="training samples/s (median)")
    for r in rows:
        if r["staleness"]:
            taus = [int(k) for k in r["staleness"]]
            total = sum(r["staleness"].values())
            axes[2].plot(
                taus,
                [v / total for v in r["staleness"].values()],
                marker="o",
                label=f"{r['strategy']} x{r['workers']}",
            )
    axes[2].set(
        title="staleness of applied pushes",
        xlabel="τ (updates since the pull)",
        ylabel="fraction",
        xlim=(-0.5, 20.5),
    )
    if any(r["staleness"] for r in rows):
        axes[2].legend(fontsize=7)
    for ax in axes[:2]:
        ax.tick_params(axis="x", labelsize=7, rotation=90)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path.parent, path.name)


def planned(work: Workload, runs: int, epochs: int, limit: int | None) -> float:
    """A rough duration of ``runs`` runs: start-up plus rows at the reference machine's speed."""
    rows = work.load(limit)[0].num_samples() or limit or 0
    return runs * (8.0 + epochs * rows / work.samples_per_s_guess)
