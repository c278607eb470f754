"""What one checkpoint costs under fsdp: sharded (every rank writes its own shards) vs full state.

gpt-tiny on 2 gloo processes (``fsdp``, AdamW, one step taken so the moments exist), saved
alternately as the training loop saves it with ``sharded_checkpoints=True`` (each rank copies
its shards to host memory, then writes them in the background; rank 0 commits the manifest)
and with ``sharded_checkpoints=False`` (the whole model and optimizer state gathered to rank 0,
copied to host memory there, written in the background by rank 0). For each kind: the median
time a save blocks rank 0's training thread, the median time to the committed checkpoint,
and the bytes it holds (the largest file one rank writes, and all files).

    python benchmarks/fsdp_checkpoint.py --saves 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _worker(coll, directory: str, saves: int, model_name: str) -> dict[str, object]:
    from sparkdp.config import CheckpointConfig, TrainingConfig
    from sparkdp.models.zoo import build_model
    from sparkdp.strategies import STRATEGIES
    from sparkdp.train.checkpoint import CheckpointPolicy
    from sparkdp.train.loop import FitSpec
    from sparkdp.train.optim import optimizer_factory, resolve_loss
    from sparkdp.train.saver import Saver

    results: dict[str, object] = {}
    for sharded in (True, False):
        torch.manual_seed(0)
        model = build_model(model_name)
        strategy = STRATEGIES.create("fsdp", sharded_checkpoints=sharded)
        model = strategy.shard(model, coll)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        strategy.setup(model, opt, coll)
        x = torch.randint(0, 256, (4, 64))
        model(x, labels=x)["loss"].backward()
        opt.step()
        out = Path(directory, "sharded" if sharded else "full")
        spec = FitSpec(
            model=model,
            loss=resolve_loss("model"),
            optimizer=optimizer_factory("adamw", model, lr=1e-3),
            strategy=strategy,
            train=None,  # type: ignore[arg-type]
            eval=None,
            training=TrainingConfig(epochs=1, batch_size=4),
        )
        policy = CheckpointPolicy(CheckpointConfig(str(out), keep_checkpoints=1), "bench")
        saver = Saver(policy, spec, strategy, opt, None, coll)
        blocked, committed = [], []
        for i in range(saves):
            coll.barrier()
            started = time.perf_counter()
            saver.save(0, i + 1, [])
            blocked.append(time.perf_counter() - started)
            saver.close()
            coll.barrier()
            committed.append(time.perf_counter() - started)
        files = [p for p in out.rglob("*") if p.is_file()]
        results["sharded" if sharded else "full"] = {
            "blocked_s": statistics.median(blocked),
            "committed_s": statistics.median(committed),
            "largest_file_bytes": max(p.stat().st_size for p in files),
            "total_bytes": sum(p.stat().st_size for p in files),
        }
        strategy.finish()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="gpt-tiny")
    args = p.parse_args()
    from tests.helpers.dist import run_workers

    with tempfile.TemporaryDirectory() as tmp:
        result = run_workers(_worker, args.workers, tmp, args.saves, args.model, timeout_s=600)[0]
    print(f"{args.model}, fsdp on {args.workers} workers, median of {args.saves} saves (rank 0)")
    print(f"{'kind':8} {'blocked ms':>11} {'committed ms':>13} {'largest file':>13} {'all files':>10}")
    for kind, row in result.items():
        print(
            f"{kind:8} {row['blocked_s'] * 1e3:11.1f} {row['committed_s'] * 1e3:13.1f} "
            f"{row['largest_file_bytes'] / 1e6:11.2f}MB {row['total_bytes'] / 1e6:8.2f}MB"
        )


if __name__ == "__main__":
    main()
