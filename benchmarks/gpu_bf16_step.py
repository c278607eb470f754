"""A language model's training step on one CUDA GPU: sparkdp's worker loop against plain PyTorch.

Both sides train the built-in GPT (``sparkdp.models.gpt``, sized by ``--layers``/``--width``) on
the same batches of token blocks with the same AdamW settings, in float32 and in bf16-mixed
(``torch.autocast(dtype=bfloat16)``, float32 parameters):

- **torch**: a hand-written loop (batch to the GPU, forward under autocast, backward, step);
- **sparkdp**: ``fit_worker``, the loop every sparkdp worker runs, with ``precision=...`` and
  ``loss="model"`` (the worker of a one-GPU Spark task, without Spark around it).

The token ids are drawn at random: a step's time does not depend on what the tokens say.
Each measurement is one epoch after a warm-up epoch, the two sides alternated ``--repeats``
times; the table gives medians of tokens per second and sparkdp's ratio to torch.

    python benchmarks/gpu_bf16_step.py              # needs CUDA
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sparkdp.comm import IndependentCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import DictData
from sparkdp.models import build_model
from sparkdp.strategies import resolve_strategy
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss

LR = 3e-4


def blocks(rows: int, block: int, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (rows, block), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(
        "gpt",
        vocab_size=args.vocab,
        block_size=args.block,
        n_layer=args.layers,
        n_head=args.width // 64,
        d_model=args.width,
    )


def torch_epoch(args: argparse.Namespace, data: DictData, precision: str, device: torch.device) -> float:
    """Tokens per second of one epoch of the hand-written loop (after a warm-up epoch)."""
    model = make_model(args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    dtype = torch.bfloat16 if precision == "bf16-mixed" else None

    def epoch(e: int) -> int:
        seen = 0
        for x, _ in data.batches(rank=0, world_size=1, epoch=e, batch_size=args.batch, seed=0):
            x = {k: v.to(device, non_blocking=True) for k, v in x.items()}
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                loss = model(**x)["loss"]
            loss.backward()
            opt.step()
            seen += x["input_ids"].numel()
        return seen

    epoch(0)
    torch.cuda.synchronize()
    began = time.perf_counter()
    tokens = epoch(1)
    torch.cuda.synchronize()
    return tokens / (time.perf_counter() - began)


def sparkdp_epoch(args: argparse.Namespace, data: DictData, precision: str, device: torch.device) -> float:
    """Tokens per second of one epoch of sparkdp's worker loop (the second of two, the first warming up)."""
    model = make_model(args)
    spec = FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("adamw", model, lr=LR),
        strategy=resolve_strategy("allreduce"),
        train=data,
        eval=None,
        training=TrainingConfig(epochs=2, batch_size=args.batch, precision=precision),
    )
    report = fit_worker(spec, IndependentCollective(0, 1, device))
    last = report.history[-1]
    return last["samples"] * args.block / last["epoch_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bf16_step.py needs a CUDA GPU")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    data = DictData(blocks(args.rows, args.block, args.vocab))
    params = sum(p.numel() for p in make_model(args).parameters())
    print(
        f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, GPT {params / 1e6:.1f}M parameters, "
        f"batch {args.batch} x {args.block} tokens, {args.rows // args.batch} steps per epoch"
    )
    rows = []
    for precision in ("32", "bf16-mixed"):
        runs: dict[str, list[float]] = {"torch": [], "sparkdp": []}
        for _ in range(args.repeats):
            runs["torch"].append(torch_epoch(args, data, precision, device))
            runs["sparkdp"].append(sparkdp_epoch(args, data, precision, device))
        t, s = (statistics.median(runs[k]) for k in ("torch", "sparkdp"))
        rows.append(
            {"precision": precision, "torch_tokens_s": t, "sparkdp_tokens_s": s, "ratio": s / t, "runs": runs}
        )
    print("| precision | torch tokens/s | sparkdp tokens/s | sparkdp / torch |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['precision']} | {r['torch_tokens_s']:,.0f} | {r['sparkdp_tokens_s']:,.0f} | {r['ratio']:.3f} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
