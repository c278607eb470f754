"""Strategies across real per-host links: allreduce, average(k=8) and asgd on the multi-host test bed.

The test bed (``tests/multihost/netbed.py``) puts the driver, a Spark Master and each Worker in a
network namespace of its own (own hostname, /etc/hosts and /dev/shm), joined by a bridge; every
host's link is limited by ``tbf`` both ways to ``--rates`` (1 Gbit/s and 100 Mbit/s by default).
Each configuration runs ``sparkdp train --dataset fashion-mnist --model cnn`` on the driver host
(``--limit`` rows, 1 epoch, SGD lr 0.05, batch 64, one core per worker) and reports samples/s over
the training time, the epoch time, the test accuracy and the bytes that crossed the links (the
tbf counters of the driver's and the workers' links, both directions summed). Needs root.

    python benchmarks/multihost.py --workers 2 --rates 1gbit 100mbit --limit 4000

Writes a markdown table to stdout and everything to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import markdown_table, write_json  # noqa: E402
from tests.multihost import netbed  # noqa: E402 - after the path is set

STRATEGIES = {"allreduce": [], "average(k=8)": ["--strategy", "average", "--strategy-option", "period=8"],
              "asgd": ["--strategy", "asgd"]}


def train(cluster: netbed.SparkOnNetBed, label: str, workers: int, args, out: Path) -> dict:
    options = STRATEGIES[label] or ["--strategy", label]
    cmd = [sys.executable, "-m", "sparkdp.cli.main", "train", "--dataset", "fashion-mnist", "--model", "cnn",
           *options, "--workers", str(workers), "--epochs", "1", "--lr", "0.05", "--limit", str(args.limit),
           "--master", cluster.master_url, "--quiet", "--json-out", str(out)]
    before = {h: cluster.bed.qdisc_stats(h) for h in cluster.bed.hosts}
    started = time.monotonic()
    proc = cluster.run_driver(cmd, timeout=args.timeout)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    after = {h: cluster.bed.qdisc_stats(h) for h in cluster.bed.hosts}
    moved = {h: sum(after[h][k] - before[h][k] for k in ("sent", "received")) for h in cluster.bed.hosts}
    summary = json.loads(out.read_text())
    history = summary.get("history") or [{}]
    workers_mb = sum(v for h, v in moved.items() if h.startswith("worker-")) / workers / 1e6
    return {"samples_per_s": summary["samples_per_s"], "epoch_s": history[-1].get("epoch_time_s"),
            "test_accuracy": history[-1].get("test_accuracy"), "wall_s": wall,
            "driver_link_mb": moved["driver"] / 1e6, "worker_link_mb": workers_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--limit", type=int, default=4000, help="training rows (default 4000)")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per training run")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench-multihost.json"))
    args = parser.parse_args()
    reason = netbed.unavailable()
    if reason:
        raise SystemExit(f"benchmarks/multihost.py: {reason}")
    netbed.install_signal_teardown()
    netbed.remove_stale()
    results = []
    for workers in args.workers:
        for rate in args.rates:
            hosts = netbed.cluster_hosts(workers)
            with netbed.NetBed(hosts, rate=rate) as bed:
                cluster = netbed.SparkOnNetBed(bed, hosts[2:]).start()
                for label in args.strategies:
                    row = {"workers": workers, "rate": rate, "strategy": label,
                           **train(cluster, label, workers, args, bed.directory / f"{label}.json")}
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    results.append(row)
    headers = ["workers", "link per host", "strategy", "samples/s", "epoch s", "test acc.", "MB per worker link",
               "MB driver link"]
    rows = [[r["workers"], r["rate"], r["strategy"], r.get("samples_per_s", r.get("error")), r.get("epoch_s"),
             f"{r['test_accuracy']:.3f}" if r.get("test_accuracy") is not None else None, r.get("worker_link_mb"),
             r.get("driver_link_mb")] for r in results]
    print(markdown_table(headers, rows, digits=1))
    write_json(args.json, {"args": vars(args), "results": results})


if __name__ == "__main__":
    main()
