"""Time from a ``sparkdp.fit`` call to its first optimizer step, for a first and a second fit
on one session: classic (``sparkdp.session("local[2]")``) or PySpark's local Spark Connect server
(``sparkdp.session("local[2]", api_mode="connect")``), what a notebook does.

    python benchmarks/first_step.py [--api-mode classic|connect] [--fits 3]

The loss function records when a worker first calls it (the first step's forward pass; its
optimizer step follows at once) in a file; both runs are on this machine, so the driver's and
the worker's clocks are the same clock. Each mode runs in a process of its own (a process holds
one kind of local session). Prints one JSON line per fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn


class FirstCall:
    """A cross-entropy loss that notes the wall-clock time of its first call in a Spark task in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, out, target):
        from pyspark import TaskContext

        # only a worker's call counts (fit also tries the model and loss once on the driver)
        if TaskContext.get() is not None and not os.path.exists(self.path):
            with open(self.path, "a") as f:
                f.write(f"{time.time()}\n")
        return nn.functional.cross_entropy(out, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-mode", choices=["classic", "connect"], default="classic")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--fits", type=int, default=2)
    args = parser.parse_args()
    import sparkdp

    t0 = time.time()
    spark = sparkdp.session(args.master, api_mode=args.api_mode)
    session_s = time.time() - t0
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2048, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.fits):
                marker = str(Path(tmp) / f"fit{i}")
                torch.manual_seed(0)
                model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
                start = time.time()
                result = sparkdp.fit(
                    model,
                    (x, y),
                    loss=FirstCall(marker),
                    workers=2,
                    epochs=1,
                    batch_size=64,
                    spark=spark,
                    show_progress=False,
                )
                total = time.time() - start
                first = float(Path(marker).read_text().split()[0]) - start
                print(
                    json.dumps(
                        {
                            "api_mode": args.api_mode,
                            "fit": i + 1,
                            "session_s": round(session_s, 2),
                            "first_step_s": round(first, 2),
                            "fit_s": round(total, 2),
                            "samples": result.history[-1]["samples"],
                        }
                    ),
                    flush=True,
                )
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
