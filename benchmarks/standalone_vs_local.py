"""A real standalone Spark cluster against local[2]: the same job's throughput, side by side.

The cluster is a Spark Master and two Workers (1 core, 2 GB each) on 127.0.0.1, started from
the installed pyspark (``tests/helpers/standalone.py``), so every worker is a separate executor
JVM with its own Python workers, as on a real cluster; only the network is loopback. The job is
``sparkdp train`` on Fashion-MNIST (built-in CNN, allreduce, 2 workers, SGD lr 0.05), run
alternately on the cluster and on the embedded ``local[2]``; the report gives each side's median
samples/s over the training time and epoch time, and the ratio. Target: the
cluster's epoch time at most 1.15x local[2]'s.

    python benchmarks/standalone_vs_local.py --repeats 2 --limit 30000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.standalone import StandaloneCluster  # noqa: E402 - after the path is set


def train(master: str, args: argparse.Namespace, out: Path, env: dict[str, str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "sparkdp.cli.main",
        "train",
        "--dataset",
        "fashion-mnist",
        "--model",
        args.model,
        "--strategy",
        args.strategy,
        "--workers",
        "2",
        "--epochs",
        str(args.epochs),
        "--lr",
        "0.05",
        "--limit",
        str(args.limit),
        "--master",
        master,
        "--quiet",
        "--json-out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{master}: sparkdp train failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(out.read_text())
    epoch_s = statistics.median(h["epoch_time_s"] for h in summary["history"])
    return {
        "samples_per_s": summary["samples_per_s"],
        "epoch_s": epoch_s,
        "accuracy": summary["test_accuracy"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit", type=int, default=30000, help="training rows (default 30000)")
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn-small"])
    p.add_argument("--strategy", default="allreduce")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"local[2]": [], "standalone": []}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cluster").mkdir()
        cluster = StandaloneCluster(Path(tmp) / "cluster", workers=2, cores=1).start()
        try:
            for repeat in range(args.repeats):
                for name in runs:
                    master = "local[2]" if name == "local[2]" else cluster.master_url
                    env = cluster.env() if name == "standalone" else dict(os.environ)
                    result = train(master, args, Path(tmp) / f"{name}-{repeat}.json", env)
                    runs[name].append(result)
                    print(
                        f"repeat {repeat + 1}  {name:>10}: {result['samples_per_s']:7.1f} samples/s, "
                        f"epoch {result['epoch_s']:5.1f} s, test accuracy {result['accuracy']:.4f}",
                        flush=True,
                    )
        finally:
            cluster.stop()
    local_epoch = statistics.median(r["epoch_s"] for r in runs["local[2]"])
    print(
        f"\nmedians over {args.repeats} repeats ({args.model}, {args.strategy}, {args.limit} rows, 2 workers):"
    )
    for name, results in runs.items():
        epoch = statistics.median(r["epoch_s"] for r in results)
        rate = statistics.median(r["samples_per_s"] for r in results)
        print(
            f"  {name:>10}: {rate:7.1f} samples/s, epoch {epoch:5.1f} s ({epoch / local_epoch:.3f}x local[2]'s "
            "epoch time)"
        )


if __name__ == "__main__":
    main()
