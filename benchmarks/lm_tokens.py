"""Language-model training throughput in tokens/s: sparkdp's strategies vs TorchDistributor vs one process.

A small GPT (``sparkdp.models`` ``gpt`` with n_layer=2, n_head=4, d_model=128 over a 2048-token
BPE vocabulary and 128-token blocks: 0.68M parameters) on the first ``--limit`` cookies of the
fortunes corpus (``sparkdp.data.text_datasets``), AdamW lr 3e-3, the model's own loss, run six ways:

  single          one PyTorch process, 2 torch threads, batch workers x batch: the ceiling
  allreduce       ``sparkdp.fit(strategy="allreduce")``, float32, on ``--workers`` workers
  allreduce-bf16  the same with ``precision="bf16-mixed"``
  average         ``strategy="average"``, parameters averaged every 8 steps
  diloco          ``strategy="diloco"``, 50 inner steps (its default)
  torchdist       PySpark's ``TorchDistributor(num_processes=workers, local_mode=True)`` running a
                  plain DDP loop (gloo, ``DistributedSampler``, one torch thread per process),
                  float32: what ``allreduce`` replaces

Every way trains the same blocks (one Parquet file written once by a preparing child; sparkdp's
workers read it themselves, as ``sparkdp train --dataset fortunes`` does; the others load it into
memory) from the same initial weights, with the same tokens per step: workers x batch x block for the
data-parallel ways, one batch of workers x batch blocks for the single process.

Throughput is trained tokens over training time (the sum of the epoch times; start-up, data
preparation and shutdown excluded; the wall time of each child process is reported beside it). Each
way runs in a child process of its own (benchmarks/common.py ``run_child``); with ``--repeats R`` the
ways are interleaved (all six, then all six again...) and medians reported, with the ratios
sparkdp/TorchDistributor and sparkdp/single of each repeat.

The loader wait of the sparkdp ways is the time a worker waited for its next batch as a share of its
step time (data + compute + communication), from the counters every worker's monitor keeps
(``sparkdp.monitor.probe``: ``data_s``, ``compute_s``, ``comm_s``), read from the job's run log.
Target: at most 5 %.

Run:  python benchmarks/lm_tokens.py --repeats 3                  # the measurement (quiet machine)
      python benchmarks/lm_tokens.py --limit 400 --ways single,allreduce   # a quick check that it works
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    child_way,
    load_blocks,
    machine_info,
    markdown_table,
    median,
    paired_ratios,
    pass_fail,
    ratio,
    ratio_check,
    run_torch_distributor,
    run_way,
    summarize_ways,
    write_json,
)

WAYS = ("single", "allreduce", "allreduce-bf16", "average", "diloco", "torchdist")
SPARKDP_WAYS = {
    "allreduce": {"strategy": "allreduce", "precision": "32"},
    "allreduce-bf16": {"strategy": "allreduce", "precision": "bf16-mixed"},
    "average": {"strategy": "average", "precision": "32", "strategy_options": {"period": 8}},
    "diloco": {"strategy": "diloco", "precision": "32"},
}
LABELS = {
    "single": "single process (2 threads)",
    "allreduce": "sparkdp allreduce fp32",
    "allreduce-bf16": "sparkdp allreduce bf16-mixed",
    "average": "sparkdp average (period 8)",
    "diloco": "sparkdp diloco (period 50)",
    "torchdist": "TorchDistributor+DDP fp32",
}
TARGET_LOADER_WAIT = 0.05  # share of a sparkdp worker's step time spent waiting for data <=


# =========================================================================== children


def _model(cfg: dict):
    import torch

    from sparkdp.models import build_model

    torch.manual_seed(cfg["seed"])
    return build_model("gpt", **cfg["model_options"])


def _child_prepare(cfg: dict, marks: dict) -> dict:
    from sparkdp.data.text import write_blocks
    from sparkdp.data.text_datasets import load_text_dataset

    opts = cfg["model_options"]
    ds = load_text_dataset(
        "fortunes", limit=cfg["limit"], vocab_size=opts["vocab_size"], block_size=opts["block_size"]
    )
    write_blocks(ds.train_blocks, cfg["data"])
    marks["prepared"] = time.time()
    return {"rows": int(ds.train_blocks.shape[0]), "vocab_size": ds.vocab_size}


def _child_single(cfg: dict, marks: dict) -> dict:
    import torch

    torch.set_num_threads(cfg["single_threads"])
    blocks = load_blocks(cfg["data"])
    model = _model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    rows = cfg["workers"] * cfg["batch_size"]
    epoch_times, losses, tokens = [], [], 0
    for epoch in range(cfg["epochs"]):
        order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(cfg["seed"] + epoch))
        started = time.perf_counter()
        for start in range(0, len(order) - rows + 1, rows):  # whole steps only, as the workers take
            batch = blocks[order[start : start + rows]]
            opt.zero_grad(set_to_none=True)
            loss = model(batch, labels=batch).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
            tokens += batch.numel()
        epoch_times.append(time.perf_counter() - started)
    return {"tokens": tokens, "train_time_s": sum(epoch_times), "loss": losses[-1]}


def _child_sparkdp(cfg: dict, marks: dict, way: str) -> dict:
    import sparkdp
    from sparkdp.monitor.report import load_run

    spark = sparkdp.session(f"local[{cfg['workers']}]")
    marks["session"] = time.time()
    settings = SPARKDP_WAYS[way]
    with tempfile.TemporaryDirectory(prefix="lm-tokens-run-") as run_dir:
        result = sparkdp.fit(
            _model(cfg),
            cfg["data"],
            features=["input_ids", "labels"],
            dict_batches=True,
            loss="model",
            optimizer="adamw",
            optimizer_options={"lr": cfg["lr"]},
            strategy=settings["strategy"],
            strategy_options=settings.get("strategy_options", {}),
            precision=settings["precision"],
            workers=cfg["workers"],
            batch_size=cfg["batch_size"],
            epochs=cfg["epochs"],
            seed=cfg["seed"],
            spark=spark,
            show_progress=False,
            run_dir=run_dir,
        )
        marks["fit_end"] = time.time()
        # every worker's last counters: seconds waiting for batches, computing, communicating
        last = {r["rank"]: r for r in load_run(run_dir).of("metrics")}
    spent = {k: sum(r[k] for r in last.values()) for k in ("data_s", "compute_s", "comm_s")}
    spark.stop()
    return {
        "tokens": result.samples * cfg["model_options"]["block_size"],
        "train_time_s": result.train_time_s,
        "loss": result.history[-1]["loss"],
        "loader_wait": ratio(spent["data_s"], sum(spent.values())),
        "time_split_s": spent,
    }


def _td_train_fn(cfg: dict, result_path: str) -> dict:
    """A plain PyTorch DDP loop over the blocks, as a TorchDistributor user would write it."""
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)  # one core per process, as sparkdp's workers (spark.task.cpus=1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    blocks = load_blocks(cfg["data"])
    model = DistributedDataParallel(_model(cfg))  # broadcasts rank 0's weights
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    sampler = DistributedSampler(range(len(blocks)), shuffle=True, seed=cfg["seed"], drop_last=True)
    epoch_times, tokens, loss = [], 0, None
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        idx = torch.tensor(list(iter(sampler)))
        started = time.perf_counter()
        for start in range(0, len(idx) - cfg["batch_size"] + 1, cfg["batch_size"]):
            batch = blocks[idx[start : start + cfg["batch_size"]]]
            opt.zero_grad(set_to_none=True)
            loss = model(batch, labels=batch)["loss"]
            loss.backward()
            opt.step()
            tokens += batch.numel()
        epoch_times.append(time.perf_counter() - started)
    total = torch.tensor([float(tokens)])
    dist.all_reduce(total)
    result = {"tokens": int(total.item()), "train_time_s": sum(epoch_times), "loss": float(loss)}
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    return result


def _child_torchdist(cfg: dict, marks: dict) -> dict:
    return run_torch_distributor(_td_train_fn, cfg, cfg["workers"], marks)


def child_main(way: str, cfg: dict) -> int:
    if way == "prepare":
        body = _child_prepare
    elif way in SPARKDP_WAYS:
        body = lambda cfg, marks: _child_sparkdp(cfg, marks, way)  # noqa: E731
    else:
        body = {"single": _child_single, "torchdist": _child_torchdist}[way]
    return child_way(way, cfg, body)


# =========================================================================== parent


def _run_way(way: str, cfg: dict, args: argparse.Namespace, log_dir: str, tag: str) -> dict[str, Any]:
    label = LABELS.get(way, way)
    return run_way(__file__, way, cfg, label=label, timeout_s=args.timeout, log_dir=log_dir, tag=tag)


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    return summarize_ways(runs, ("tokens_per_s", "train_time_s", "wall_s", "loss", "loader_wait"))


def print_report(cfg: dict, runs: dict[str, list[dict]], summary: dict[str, dict]) -> list[dict]:
    opts = cfg["model_options"]
    cookies = "all" if cfg["limit"] is None else f"first {cfg['limit']:,}"
    print(
        f"\n## Language-model tokens/s — gpt {opts['n_layer']} x {opts['d_model']} ({opts['n_head']} heads), "
        f"vocabulary {opts['vocab_size']}, blocks of {opts['block_size']}, {cfg['rows']:,} blocks "
        f"(fortunes, {cookies} cookies), "
        f"{cfg['workers']} workers x batch {cfg['batch_size']}, {cfg['epochs']} epoch(s), "
        f"{cfg['repeats']} repeat(s) (medians)\n"
    )
    rows = []
    for way, s in summary.items():
        if not s["ok_runs"]:
            rows.append([LABELS[way], "FAILED", None, None, None, None, None, None])
            continue
        rows.append(
            [
                LABELS[way],
                s["tokens_per_s"],
                ratio(s["tokens_per_s"], summary.get("single", {}).get("tokens_per_s")),
                ratio(s["tokens_per_s"], summary.get("torchdist", {}).get("tokens_per_s")),
                s["train_time_s"],
                s["wall_s"],
                s["loss"],
                None if s["loader_wait"] is None else 100 * s["loader_wait"],
            ]
        )
    headers = [
        "way",
        "tokens/s",
        "/ single",
        "/ TorchDistributor",
        "train (s)",
        "wall (s)",
        "last train loss",
        "loader wait (% of step)",
    ]
    print(markdown_table(headers, rows))
    checks = []
    for way in SPARKDP_WAYS:
        for other in ("torchdist", "single"):
            values = paired_ratios(runs, way, other)
            if values:
                checks.append(ratio_check(f"{LABELS[way]} / {LABELS[other]} tokens/s", values))
    bf16 = paired_ratios(runs, "allreduce-bf16", "allreduce")
    if bf16:
        checks.append(ratio_check("bf16-mixed / fp32 tokens/s (allreduce)", bf16))
    for way in SPARKDP_WAYS:
        waits = [
            r["loader_wait"] for r in runs.get(way, []) if r.get("ok") and r.get("loader_wait") is not None
        ]
        if waits:
            m = median(waits)
            checks.append(
                {
                    "check": f"loader wait, {LABELS[way]} (% of step time)",
                    "value": m,
                    "display": f"{100 * m:.2f} % (repeats: {', '.join(f'{100 * v:.2f}' for v in waits)})",
                    "target": f"<= {100 * TARGET_LOADER_WAIT:.0f} %",
                    "pass": m <= TARGET_LOADER_WAIT,
                }
            )
    print()
    print(
        markdown_table(
            ["check", "measured", "target", "result"],
            [[c["check"], c["display"], c["target"], pass_fail(c["pass"])] for c in checks],
        )
    )
    for way, s in summary.items():
        if not s["ok_runs"]:
            print(f"\n**{LABELS[way]} FAILED**: {s['error']}")
    print()
    return checks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--limit", type=int, default=6000, metavar="N", help="the first N cookies (default 6000)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="blocks per worker per step (default 8)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument(
        "--repeats", type=int, default=1, metavar="R", help="interleaved repeats; medians reported"
    )
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {', '.join(WAYS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per child process (seconds)")
    p.add_argument("--json-out", metavar="FILE", help="also write every run and the summary as JSON here")
    p.add_argument("--log-dir", help="where each child's output goes (default: a new temp directory)")
    p.add_argument("--child", choices=(*WAYS, "prepare"), help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("epochs", "workers", "batch_size", "repeats", "limit"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not set(args.ways.split(",")) <= set(WAYS):
        p.error(f"--ways takes a comma-separated subset of {', '.join(WAYS)}; got {args.ways!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, json.loads(args.config))
    ways = [w for w in WAYS if w in args.ways.split(",")]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="sparkdp-bench-lm-")
    os.makedirs(log_dir, exist_ok=True)
    cfg: dict[str, Any] = {
        "limit": args.limit,
        "epochs": args.epochs,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "lr": 3e-3,
        "seed": args.seed,
        "single_threads": 2,
        "repeats": args.repeats,
        "model_options": {
            "n_layer": args.n_layer,
            "n_head": args.n_head,
            "d_model": args.d_model,
            "vocab_size": args.vocab_size,
            "block_size": args.block_size,
        },
        "data": os.path.join(log_dir, "train-blocks.parquet"),
    }
    print(
        f"lm_tokens: {', '.join(ways)} x {args.repeats}; logs in {log_dir}; {machine_info()}", file=sys.stderr
    )
    prepared = _run_way("prepare", cfg, args, log_dir, "0")
    if not prepared.get("ok"):
        return 1
    cfg["rows"] = prepared["rows"]
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for rep in range(args.repeats):
        for way in ways:
            runs[way].append(_run_way(way, cfg, args, log_dir, str(rep + 1)))
    summary = summarize(runs)
    checks = print_report(cfg, runs, summary)
    if args.json_out:
        write_json(
            args.json_out,
            {
                "benchmark": "lm_tokens",
                "config": cfg,
                "machine": machine_info(),
                "summary": summary,
                "checks": checks,
                "runs": runs,
            },
        )
    return 0 if all(s["ok_runs"] == s["runs"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
