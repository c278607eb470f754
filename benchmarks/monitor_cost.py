"""What live monitoring costs: samples/s monitored vs quiet, side by side in one invocation.

The same Fashion-MNIST job (built-in CNN, 2 workers on local[2], SGD lr 0.05 momentum 0.9)
runs alternately quiet with every sink off (``show_progress=False``: the workers are not
monitored at all) and monitored at the default level (the live display, every worker reporting
every 2 s, straggler scores, a run log in a temporary directory); the report gives each
variant's median samples/s and the ratio. Target: <= 3 % difference.

    python benchmarks/monitor_cost.py --repeats 3 --limit 30000 --epochs 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--limit", type=int, default=30000, help="training rows (default 30000)")
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn-small"])
    p.add_argument("--strategy", default="allreduce")
    args = p.parse_args()
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=args.limit))
    spark = sparkdp.session()
    rates: dict[str, list[float]] = {"quiet": [], "monitored": []}
    for repeat in range(args.repeats):
        for name in rates:
            with tempfile.TemporaryDirectory() as directory:
                options = {"show_progress": False} if name == "quiet" else {"run_dir": directory}
                torch.manual_seed(0)
                started = time.perf_counter()
                result = sparkdp.fit(
                    build_model(args.model),
                    train,
                    eval_data=test,
                    workers=2,
                    epochs=args.epochs,
                    strategy=args.strategy,
                    optimizer_options={"lr": 0.05},
                    spark=spark,
                    **options,
                )
            rates[name].append(result.samples_per_s)
            print(
                f"repeat {repeat + 1} {name:>10}: {result.samples_per_s:8.1f} samples/s, "
                f"{time.perf_counter() - started:6.1f} s, test accuracy {result.test_accuracy:.4f}",
                flush=True,
            )
    base = statistics.median(rates["quiet"])
    print(
        f"\nmedians over {args.repeats} repeats ({args.model}, {args.strategy}, {args.limit} rows, "
        f"{args.epochs} epoch(s), 2 workers):"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:>10}: {median:8.1f} samples/s  ({median / base:.3f}x quiet)")


if __name__ == "__main__":
    main()
