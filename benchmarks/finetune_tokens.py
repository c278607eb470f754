"""Fine-tuning throughput in tokens/s: LoRA against a full fine-tune of a pretrained Hugging Face
GPT-2, under sparkdp's ``allreduce`` and ``fsdp``, beside TorchDistributor running the same loop and
one process, at the same precision.

A GPT-2 of ``--layers`` layers of width ``--width`` (4 x 256 by default, heads of 64) over the
fortunes corpus' BPE vocabulary (``sparkdp.data.text_datasets``, ``--vocab-size`` tokens) and
``--block-size``-token blocks is built from a config (seed 0, no dropout, ``use_cache=False``) and
written with ``save_pretrained``: the "pretrained" checkpoint every way opens with
``from_pretrained`` (throughput does not depend on what the weights say). The first ``--limit``
cookies, packed into blocks, are written once as Parquet. Each way fine-tunes it one epoch, AdamW
(lr 5e-4 full, 2e-3 LoRA), the model's own loss, in two modes:

  full   every parameter trains
  lora   ``peft.get_peft_model`` with LoRA r=``--rank`` on c_attn, c_proj and c_fc
         (``benchmarks/lora_bytes.py``'s ``lora_config``), the base frozen

and four runners, each at every ``--precisions`` (fp32: precision "32"; bf16: "bf16-mixed", bfloat16
autocast, a frozen base stored in bfloat16 as sparkdp stores it):

  single     one PyTorch process, 2 torch threads, one batch of workers x batch blocks a step
  allreduce  ``sparkdp.fit(strategy="allreduce")`` on ``--workers`` workers, the workers reading the
             Parquet file themselves
  fsdp       ``sparkdp.fit(strategy="fsdp")``: parameters, gradients and optimizer state sharded
  torchdist  PySpark's ``TorchDistributor(num_processes=workers, local_mode=True)`` running a plain
             DDP loop (gloo, ``DistributedSampler``, one torch thread a process) with the same
             model, data, batch, optimizer and precision

Tokens/s is trained tokens over training time (the sum of the epoch times; start-up, data loading
and shutdown excluded; each child's wall time is reported beside it). Every way runs in a child
process of its own (``benchmarks/common.py``); with ``--repeats R`` all ways run once, then all
again..., and the table gives medians, the ratios of the medians, and the medians of the paired
ratios (sparkdp / TorchDistributor, LoRA / full) of each repeat.

Bytes: what a worker sends per optimizer step and what a checkpoint (and ``fit``'s result) keeps,
LoRA against full, from the strategies' formulas (``benchmarks/lora_bytes.py``) for this model, and
as measured: the bytes the workers' strategies counted per step (the run log's ``bytes_sent``) and
the safetensors bytes of the state ``fit`` returned.

Run:  python benchmarks/finetune_tokens.py --repeats 2                 # the measurement
      python benchmarks/finetune_tokens.py --limit 120 --runners single,allreduce --modes lora
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
    ratio,
    ratio_check,
    run_torch_distributor,
    run_way,
    summarize_ways,
    write_json,
)
from lora_bytes import checkpoint_bytes, lora_config, per_step  # noqa: E402

RUNNERS = ("single", "allreduce", "fsdp", "torchdist")
MODES = ("lora", "full")
PRECISIONS = {"fp32": "32", "bf16": "bf16-mixed"}
RUNNER_LABELS = {
    "single": "one process (2 threads)",
    "allreduce": "sparkdp allreduce",
    "fsdp": "sparkdp fsdp",
    "torchdist": "TorchDistributor + DDP",
}
LEARNING_RATES = {"full": 5e-4, "lora": 2e-3}
SUMMARY_KEYS = ("tokens_per_s", "train_time_s", "wall_s", "loss", "loader_wait", "bytes_per_step")


def way_name(runner: str, mode: str, precision: str) -> str:
    return f"{runner}-{mode}-{precision}"


def parse_way(way: str) -> tuple[str, str, str]:
    runner, mode, precision = way.split("-")
    return runner, mode, precision


def label(way: str) -> str:
    runner, mode, precision = parse_way(way)
    return f"{RUNNER_LABELS[runner]}, {mode}, {precision}"


# =========================================================================== children


def _model(cfg: dict, mode: str, precision: str):
    """The pretrained GPT-2, LoRA-wrapped for ``mode="lora"``; under bf16 a frozen base is stored in
    bfloat16 (what sparkdp's loop does), the adapters stay float32."""
    import torch
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(cfg["base"])
    if mode == "lora":
        import peft

        torch.manual_seed(cfg["seed"] + 1)
        model = peft.get_peft_model(model, lora_config(cfg["rank"]))
        if precision == "bf16":
            for p in model.parameters():
                if not p.requires_grad and p.is_floating_point():
                    p.data = p.data.to(torch.bfloat16)
    return model.train()


def _train_epoch(model, optimizer, blocks, order, rows: int, precision: str) -> tuple[int, float]:
    """One epoch of the loop every plain way runs: whole batches of ``rows`` blocks in ``order``,
    the model's own loss under bfloat16 autocast for bf16; the tokens trained and the epoch's mean
    loss (what sparkdp's history reports)."""
    import torch

    tokens, losses = 0, []
    for start in range(0, len(order) - rows + 1, rows):  # whole steps only, as the workers take
        batch = blocks[order[start : start + rows]]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(input_ids=batch, labels=batch).loss
        out.backward()
        optimizer.step()
        tokens = tokens + batch.numel()
        losses.append(out.item())
    return tokens, sum(losses) / max(len(losses), 1)


def _optimizer(cfg: dict, model, mode: str):
    import torch

    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATES[mode])


def _child_prepare(cfg: dict, marks: dict) -> dict:
    import torch
    import transformers

    from sparkdp.data.text import write_blocks
    from sparkdp.data.text_datasets import load_text_dataset

    ds = load_text_dataset(
        "fortunes", limit=cfg["limit"], vocab_size=cfg["vocab_size"], block_size=cfg["block_size"]
    )
    write_blocks(ds.train_blocks, cfg["data"])
    config = transformers.GPT2Config(
        vocab_size=ds.vocab_size,
        n_positions=cfg["block_size"],
        n_embd=cfg["width"],
        n_layer=cfg["layers"],
        n_head=max(1, cfg["width"] // 64),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        bos_token_id=ds.eos_id,
        eos_token_id=ds.eos_id,
    )
    torch.manual_seed(cfg["seed"])
    transformers.GPT2LMHeadModel(config).save_pretrained(cfg["base"])
    marks["prepared"] = time.time()
    return {"rows": int(ds.train_blocks.shape[0]), "vocab_size": ds.vocab_size, **_bytes(cfg)}


def _bytes(cfg: dict) -> dict:
    """Parameters, and lora_bytes.py's formulas for this model: bytes per step and per checkpoint."""
    import torch

    out: dict[str, Any] = {"bytes": {}}
    for precision in cfg["precisions"]:
        for mode in MODES:
            model = _model(cfg, mode, precision)
            gathered = torch.bfloat16 if precision == "bf16" else torch.float32
            out["bytes"][f"{mode}-{precision}"] = {
                **per_step(model, cfg["workers"], gathered),
                "checkpoint": checkpoint_bytes(model),
            }
            out[f"{mode}_parameters"] = sum(p.numel() for p in model.parameters())
            out[f"{mode}_trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return out


def _child_single(cfg: dict, marks: dict, mode: str, precision: str) -> dict:
    import torch

    torch.set_num_threads(cfg["single_threads"])
    blocks = load_blocks(cfg["data"])
    model = _model(cfg, mode, precision)
    optimizer = _optimizer(cfg, model, mode)
    epoch_times, tokens, loss = [], 0, float("nan")
    for epoch in range(cfg["epochs"]):
        order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(cfg["seed"] + epoch))
        started = time.perf_counter()
        trained, loss = _train_epoch(
            model, optimizer, blocks, order, cfg["workers"] * cfg["batch_size"], precision
        )
        epoch_times.append(time.perf_counter() - started)
        tokens += trained
    return {"tokens": tokens, "train_time_s": sum(epoch_times), "loss": loss}


def _child_sparkdp(cfg: dict, marks: dict, runner: str, mode: str, precision: str) -> dict:
    import sparkdp
    from sparkdp.monitor.report import load_run
    from sparkdp.state import state_to_bytes

    spark = sparkdp.session(f"local[{cfg['workers']}]")
    marks["session"] = time.time()
    with tempfile.TemporaryDirectory(prefix="finetune-tokens-run-") as run_dir:
        result = sparkdp.fit(
            _model(cfg, mode, "fp32"),  # the loop stores a frozen base in bf16 itself
            cfg["data"],
            features=["input_ids", "labels"],
            dict_batches=True,
            loss="model",
            optimizer="adamw",
            optimizer_options={"lr": LEARNING_RATES[mode]},
            strategy=runner,
            precision=PRECISIONS[precision],
            workers=cfg["workers"],
            batch_size=cfg["batch_size"],
            epochs=cfg["epochs"],
            seed=cfg["seed"],
            spark=spark,
            show_progress=False,
            run_dir=run_dir,
        )
        marks["fit_end"] = time.time()
        last = {r["rank"]: r for r in load_run(run_dir).of("metrics")}  # every worker's last counters
    spent = {k: sum(r[k] for r in last.values()) for k in ("data_s", "compute_s", "comm_s")}
    spark.stop()
    return {
        "tokens": result.samples * cfg["block_size"],
        "train_time_s": result.train_time_s,
        "loss": result.history[-1]["loss"],
        "loader_wait": ratio(spent["data_s"], sum(spent.values())),
        "bytes_per_step": median(ratio(r["bytes_sent"], r["steps"]) for r in last.values()),
        "result_bytes": len(state_to_bytes(result.state_dict())),
    }


def _td_train_fn(cfg: dict, result_path: str) -> dict:
    """The plain loop under DDP, as a TorchDistributor user would write it."""
    mode, precision = cfg["mode"], cfg["precision"]
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    torch.set_num_threads(1)  # one core per process, as sparkdp's workers (spark.task.cpus=1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    blocks = load_blocks(cfg["data"])
    model = DistributedDataParallel(_model(cfg, mode, precision))  # broadcasts rank 0's weights
    optimizer = _optimizer(cfg, model, mode)
    sampler = DistributedSampler(range(len(blocks)), shuffle=True, seed=cfg["seed"], drop_last=True)
    epoch_times, tokens, loss = [], 0, float("nan")
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        started = time.perf_counter()
        trained, loss = _train_epoch(model, optimizer, blocks, order, cfg["batch_size"], precision)
        epoch_times.append(time.perf_counter() - started)
        tokens += trained
    total = torch.tensor([float(tokens)])
    dist.all_reduce(total)
    result = {"tokens": int(total.item()), "train_time_s": sum(epoch_times), "loss": loss}
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    return result


def _child_torchdist(cfg: dict, marks: dict, mode: str, precision: str) -> dict:
    cfg = dict(cfg, mode=mode, precision=precision)
    return run_torch_distributor(_td_train_fn, cfg, cfg["workers"], marks)


def child_main(way: str, cfg: dict) -> int:
    if way == "prepare":
        return child_way(way, cfg, _child_prepare)
    runner, mode, precision = parse_way(way)
    if runner in ("allreduce", "fsdp"):
        return child_way(way, cfg, lambda c, m: _child_sparkdp(c, m, runner, mode, precision))
    body = {"single": _child_single, "torchdist": _child_torchdist}[runner]
    return child_way(way, cfg, lambda c, m: body(c, m, mode, precision))


# =========================================================================== parent


def throughput_table(cfg: dict, ways: list[str], summary: dict[str, dict]) -> str:
    """One row a way: medians, and the ratios of the medians to the same mode and precision's
    single process and TorchDistributor, and to the same runner and precision's full fine-tune."""

    def tps(runner: str, mode: str, precision: str) -> float | None:
        return summary.get(way_name(runner, mode, precision), {}).get("tokens_per_s")

    rows = []
    for way in ways:
        s, (runner, mode, precision) = summary[way], parse_way(way)
        if not s["ok_runs"]:
            rows.append([label(way), "FAILED", *[None] * 8])
            continue
        mine = s["tokens_per_s"]
        wait = s["loader_wait"]
        rows.append(
            [
                label(way),
                mine,
                ratio(mine, tps("single", mode, precision)),
                ratio(mine, tps("torchdist", mode, precision)),
                ratio(mine, tps(runner, "full", precision)) if mode == "lora" else None,
                s["train_time_s"],
                s["wall_s"],
                s["loss"],
                None if wait is None else 100 * wait,
                None if s["bytes_per_step"] is None else int(s["bytes_per_step"]),
            ]
        )
    headers = [
        "way",
        "tokens/s",
        "/ one process",
        "/ TorchDistributor",
        "LoRA / full",
        "train (s)",
        "wall (s)",
        "epoch loss",
        "loader wait (%)",
        "bytes sent / step / worker",
    ]
    return markdown_table(headers, rows)


def paired_checks(ways: list[str], runs: dict[str, list[dict]]) -> list[dict]:
    """The medians of each repeat's ratios: sparkdp / TorchDistributor and LoRA / full."""
    checks = []
    for way in ways:
        runner, mode, precision = parse_way(way)
        if runner in ("allreduce", "fsdp"):
            values = paired_ratios(runs, way, way_name("torchdist", mode, precision))
            if values:
                checks.append(ratio_check(f"{label(way)} / TorchDistributor tokens/s", values))
        if mode == "lora":
            values = paired_ratios(runs, way, way_name(runner, "full", precision))
            if values:
                checks.append(
                    ratio_check(f"{RUNNER_LABELS[runner]}, {precision}: LoRA / full tokens/s", values)
                )
    return checks


def bytes_table(prepared: dict, summary: dict[str, dict], precisions: list[str]) -> str:
    """lora_bytes.py's formulas for this model, full against LoRA, beside what the runs measured:
    the bytes the strategies counted per step, and the size of the state fit returned."""

    def measured(runner: str, precision: str, key: str) -> list[int | None]:
        got = [summary.get(way_name(runner, m, precision), {}).get(key) for m in ("full", "lora")]
        return [None if v is None else int(v) for v in got]

    rows = []
    for precision in precisions:
        full, lora = prepared["bytes"][f"full-{precision}"], prepared["bytes"][f"lora-{precision}"]
        for key, runner, what in (
            ("allreduce", "allreduce", "allreduce: sent / step / worker"),
            ("fsdp", "fsdp", "fsdp: sent / step / worker"),
            ("checkpoint", "allreduce", "checkpoint / result model state"),
        ):
            got = measured(runner, precision, "result_bytes" if key == "checkpoint" else "bytes_per_step")
            rows.append([f"{what}, {precision}", full[key], lora[key], ratio(lora[key], full[key]), *got])
    headers = ["", "full (formula)", "LoRA (formula)", "LoRA / full", "full (measured)", "LoRA (measured)"]
    return markdown_table(headers, rows, digits=4)


def print_report(
    cfg: dict, prepared: dict, ways: list[str], runs: dict[str, list[dict]]
) -> tuple[dict, list]:
    summary = summarize_ways(runs, SUMMARY_KEYS)
    for way in ways:  # the measured result size does not vary between repeats
        good = [r for r in runs[way] if r.get("ok")]
        summary[way]["result_bytes"] = good[0].get("result_bytes") if good else None
    print(
        f"\n## Fine-tuning tokens/s: GPT-2 {cfg['layers']} x {cfg['width']} "
        f"({prepared['full_parameters']:,} parameters; LoRA r={cfg['rank']} trains "
        f"{prepared['lora_trainable']:,}), vocabulary {prepared['vocab_size']:,}, blocks of "
        f"{cfg['block_size']}, {cfg['rows']:,} blocks (fortunes, first {cfg['limit']:,} cookies), "
        f"{cfg['workers']} workers x batch {cfg['batch_size']}, {cfg['epochs']} epoch(s), "
        f"{cfg['repeats']} repeat(s) (medians)\n"
    )
    print(throughput_table(cfg, ways, summary))
    checks = paired_checks(ways, runs)
    print("\nPaired ratios (each repeat's ways back to back):\n")
    print(markdown_table(["ratio", "measured"], [[c["check"], c["display"]] for c in checks]))
    print(f"\nBytes, LoRA against full ({cfg['workers']} workers; formulas: benchmarks/lora_bytes.py):\n")
    print(bytes_table(prepared, summary, cfg["precisions"]))
    for way in ways:
        if not summary[way]["ok_runs"]:
            print(f"\n**{label(way)} FAILED**: {summary[way]['error']}")
    print()
    return summary, checks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--limit", type=int, default=1000, metavar="N", help="the first N cookies (default 1000)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="blocks per worker per step (default 8)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument(
        "--repeats", type=int, default=1, metavar="R", help="interleaved repeats; medians reported"
    )
    p.add_argument(
        "--runners", default=",".join(RUNNERS), help=f"a comma-separated subset of {', '.join(RUNNERS)}"
    )
    p.add_argument("--modes", default=",".join(MODES), help=f"a comma-separated subset of {', '.join(MODES)}")
    p.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help=f"a comma-separated subset of {', '.join(PRECISIONS)}",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per child process (seconds)")
    p.add_argument("--json-out", metavar="FILE", help="also write every run and the summary as JSON here")
    p.add_argument("--log-dir", help="where each child's output goes (default: a new temp directory)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("epochs", "workers", "batch_size", "repeats", "limit", "rank", "layers", "width"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for flag, allowed in (("runners", RUNNERS), ("modes", MODES), ("precisions", tuple(PRECISIONS))):
        if not set(getattr(args, flag).split(",")) <= set(allowed):
            p.error(
                f"--{flag} takes a comma-separated subset of {', '.join(allowed)}; got {getattr(args, flag)!r}"
            )
    return args


def chosen(value: str, allowed: tuple[str, ...]) -> list[str]:
    return [a for a in allowed if a in value.split(",")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, json.loads(args.config))
    precisions = chosen(args.precisions, tuple(PRECISIONS))
    ways = [
        way_name(r, m, p)
        for p in precisions
        for m in chosen(args.modes, MODES)
        for r in chosen(args.runners, RUNNERS)
    ]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="sparkdp-bench-finetune-")
    os.makedirs(log_dir, exist_ok=True)
    cfg: dict[str, Any] = {
        **{k: getattr(args, k) for k in ("limit", "epochs", "workers", "batch_size", "layers", "width")},
        **{k: getattr(args, k) for k in ("rank", "vocab_size", "block_size", "seed", "repeats")},
        "precisions": precisions,
        "single_threads": 2,
        "data": os.path.join(log_dir, "train-blocks.parquet"),
        "base": os.path.join(log_dir, "pretrained"),
    }
    started = machine_info()
    print(
        f"finetune_tokens: {len(ways)} ways x {args.repeats}; logs in {log_dir}; {started}", file=sys.stderr
    )

    def run(way: str, tag: str) -> dict[str, Any]:
        name = "prepare" if way == "prepare" else label(way)
        return run_way(__file__, way, cfg, label=name, timeout_s=args.timeout, log_dir=log_dir, tag=tag)

    prepared = run("prepare", "0")
    if not prepared.get("ok"):
        return 1
    cfg["rows"] = prepared["rows"]
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for rep in range(args.repeats):
        for way in ways:
            runs[way].append(run(way, str(rep + 1)))
    summary, checks = print_report(cfg, prepared, ways, runs)
    ended = machine_info()
    print(
        f"load average (1 min): {started.get('load_avg_1m')} at the start, {ended.get('load_avg_1m')} at the end"
    )
    if args.json_out:
        write_json(
            args.json_out,
            {
                "benchmark": "finetune_tokens",
                "config": cfg,
                "machine": {"start": started, "end": ended},
                "prepared": prepared,
                "summary": summary,
                "checks": checks,
                "runs": runs,
            },
        )
    return 0 if all(s["ok_runs"] == s["runs"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
