"""Equivalence study (the Deeplearning4j claim): parameter averaging with k = 1 is single-machine SGD.

    python benchmarks/equivalence_study.py [--workers 2] [--batch 64] [--limit 12000] [--model mlp]

With plain SGD (no momentum) and M workers each taking a step on its own batch of m rows,
averaging the parameters after every step gives ``θ - lr · mean_r g_r``: exactly one SGD step
on the M·m rows together.  The reference here is one process with ``torch.optim.SGD`` fed,
step by step, the concatenation of the batches every rank would read (the same sharding and
shuffling code, ``TensorData.batches``); sparkdp's run is real Spark training with
``average`` on ``M`` workers.  After one epoch the script prints the relative parameter
difference ``‖θ_sparkdp − θ_ref‖ / ‖θ_ref‖`` for k = 1 (float error only; the target is
≤ 1e-4) and for k = 2, 8, 32, where the workers drift apart between averages and the gap
to the large-batch trajectory grows; and each run's test accuracy.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_info, markdown_table  # noqa: E402


def reference(model, train, workers: int, batch: int, lr: float, seed: int):
    """One process, SGD on the concatenation of every rank's step-s batch."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)
    streams = [
        train.batches(rank=r, world_size=workers, epoch=0, batch_size=batch, seed=seed)
        for r in range(workers)
    ]
    for parts in zip(*streams, strict=True):
        x = torch.cat([p[0] for p in parts])
        y = torch.cat([p[1] for p in parts])
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def accuracy(model, test) -> float:
    model.eval()
    with torch.no_grad():
        x, y = test.features.float(), test.labels
        if test.divisor is not None:
            x = x / test.divisor
        return float((model(x).argmax(1) == y).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--limit", type=int, default=12000)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--periods", default="1,2,8,32")
    args = ap.parse_args()

    import sparkdp
    from sparkdp.data.datasets import dataset_tensors, load_dataset
    from sparkdp.models import build_model

    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=args.limit))
    torch.manual_seed(0)
    start = build_model(args.model)
    ref = reference(start, train, args.workers, args.batch, args.lr, seed=0)
    ref_flat = flat(ref)
    spark = sparkdp.session(f"local[{args.workers}]", log_level="OFF")
    rows = [["single process, batch M·m", "—", f"{accuracy(ref, test):.4f}"]]
    for k in (int(v) for v in args.periods.split(",")):
        result = sparkdp.fit(
            copy.deepcopy(start),
            train,
            strategy="average",
            strategy_options={"period": k},
            workers=args.workers,
            epochs=1,
            batch_size=args.batch,
            seed=0,
            optimizer="sgd",
            optimizer_options={"lr": args.lr, "momentum": 0.0},
            spark=spark,
            show_progress=False,
        )
        gap = float((flat(result.model) - ref_flat).norm() / ref_flat.norm())
        rows.append(
            [f"sparkdp average k={k}, M={args.workers}", f"{gap:.2e}", f"{accuracy(result.model, test):.4f}"]
        )
        print(rows[-1], flush=True)
    print(machine_info())
    print(
        f"{args.model}, {args.limit} Fashion-MNIST rows, one epoch, M = {args.workers} workers x m = {args.batch} "
        f"rows, plain SGD lr {args.lr}"
    )
    print(markdown_table(["run", "‖θ − θ_ref‖ / ‖θ_ref‖ after 1 epoch", "test accuracy"], rows))


if __name__ == "__main__":
    main()
