"""What checkpoints cost: samples/s with checkpoints vs none, side by side in one invocation.

The same Fashion-MNIST job (built-in CNN, 2 workers on local[2], SGD lr 0.05 momentum 0.9)
runs alternately with no checkpoints (``max_restarts=0``, no ``checkpoint_dir``), with the
default epoch-end checkpoints, and with checkpoints every ``--every`` steps as well; the
report gives each variant's median samples/s and its ratio to no checkpoints.
Target: epoch-end checkpoints cost <= 3 %.

    python benchmarks/checkpoint_cost.py --repeats 3 --limit 30000 --epochs 2
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
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, default=30000, help="training rows (default 30000)")
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn-small"])
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints in the 'every' variant")
    args = p.parse_args()
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=args.limit))
    spark = sparkdp.session()
    variants = {"none": {"max_restarts": 0}, "epoch": {}, f"every {args.every} steps": {"checkpoint_every": args.every}}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, options in variants.items():
            with tempfile.TemporaryDirectory() as directory:
                if name != "none":
                    options = {**options, "checkpoint_dir": directory}
                torch.manual_seed(0)
                started = time.perf_counter()
                result = sparkdp.fit(build_model(args.model), train, eval_data=test, workers=2, epochs=args.epochs,
                                     optimizer_options={"lr": 0.05}, spark=spark, show_progress=False, **options)
            rates[name].append(result.samples_per_s)
            print(f"repeat {repeat + 1} {name:>16}: {result.samples_per_s:8.1f} samples/s, "
                  f"{time.perf_counter() - started:6.1f} s, test accuracy {result.test_accuracy:.4f}", flush=True)
    base = statistics.median(rates["none"])
    print(f"\nmedians over {args.repeats} repeats ({args.model}, {args.limit} rows, {args.epochs} epochs, 2 workers):")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:>16}: {median:8.1f} samples/s  ({median / base:.3f}x no checkpoints)")


if __name__ == "__main__":
    main()
