"""Fine-tuning examples packed vs padded (sparkdp.data.sft): real (non-pad) training tokens per
second, and the held-out loss each reaches, on one process.

A 2-layer GPT-2 (built from a config, use_cache=False, sdpa attention) trains one epoch of AdamW
on the same prompt/completion examples of skewed lengths (most short, a few near block_size),
either packed (several examples a row, position_ids restarting per example) or padded (one
example a row, right-padded, with an attention_mask): the rows ExamplePacker builds for
tokenize_examples. Padding is measured twice: to block_size, as the rows are stored, and cut
to the longest example of each batch (what a dynamic-padding collator does), the fairer
baseline. Each mode runs --repeats times, interleaved; the medians are printed. The held-out loss is the completion tokens' mean cross entropy,
each example run alone. One torch thread (a Spark task's core).

    python benchmarks/sft_packing.py [--examples 1200] [--block 128] [--seed 0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
import torch.nn.functional as F

from sparkdp.data.sft import ExamplePacker

VOCAB = 256


def examples(count: int, block: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """Prompt/completion examples with log-normal lengths (median about block/8, a long tail cut
    at block): the completion continues the prompt's arithmetic sequence, so there is something
    to learn."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(block / 8), 0.7, count).astype(int), 4, block)
    out = []
    for n in lengths:
        start, step = rng.integers(1, VOCAB), rng.integers(1, 7)
        ids = [int((start + i * step) % (VOCAB - 1)) + 1 for i in range(n)]
        prompt = n // 2
        out.append((ids, [-100] * prompt + ids[prompt:]))
    return out


def rows(data, block: int, packing: bool) -> dict[str, torch.Tensor]:
    packer = ExamplePacker(block, 0, packing, "truncate")
    batches = [b for b in (packer.add(data), packer.finish()) if b is not None]
    cols = {k: sum((b.to_pydict()[k] for b in batches), []) for k in batches[0].schema.names[:3]}
    return {k: torch.tensor(v) for k, v in cols.items()}


def gpt2(block: int):
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=block,
        n_embd=64,
        n_layer=2,
        n_head=2,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def train(model, data: dict[str, torch.Tensor], batch: int, real_tokens: int, trim: bool) -> float:
    """One epoch; real training tokens per second. ``trim``: each padded batch cut to its
    longest row."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    order = torch.randperm(len(data["input_ids"]), generator=torch.Generator().manual_seed(1))
    started = time.perf_counter()
    for i in range(0, len(order), batch):
        part = {k: v[order[i : i + batch]] for k, v in data.items()}
        if trim:
            longest = int(part["attention_mask"].sum(1).max())
            part = {k: v[:, :longest] for k, v in part.items()}
        optimizer.zero_grad(set_to_none=True)
        model(**part).loss.backward()
        optimizer.step()
    return real_tokens / (time.perf_counter() - started)


@torch.no_grad()
def held_out_loss(model, data) -> float:
    model.eval()
    total, count = 0.0, 0
    for ids, labels in data:
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
        target = torch.tensor(labels[1:])
        total += F.cross_entropy(logits, target, ignore_index=-100, reduction="sum").item()
        count += int((target != -100).sum())
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1200)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = examples(args.examples, args.block, args.seed)
    held_out = examples(200, args.block, args.seed + 1)
    real = sum(len(ids) for ids, _ in data)
    base = gpt2(args.block)
    print(
        f"{args.examples} examples, {real} tokens, block {args.block}, median length "
        f"{int(np.median([len(i) for i, _ in data]))}"
    )
    modes = (("padded", False, False), ("padded per batch", False, True), ("packed", True, False))
    tables = {name: rows(data, args.block, packing) for name, packing, _ in modes}
    speeds: dict[str, list[float]] = {name: [] for name, _, _ in modes}
    losses: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, _, trim in modes:
            table = tables[name]
            model = copy.deepcopy(base).train()
            # the same examples per optimizer step on average: batch rows of as many tokens
            per_row = real / len(table["input_ids"])
            batch = max(1, round(16 * (real / args.examples) / per_row))
            speeds[name].append(train(model, table, batch, real, trim))
            losses[name] = held_out_loss(model, held_out)
    results = {name: float(np.median(v)) for name, v in speeds.items()}
    for name, _, _ in modes:
        table = tables[name]
        print(
            f"{name}: {len(table['input_ids'])} rows ({100 * real / table['input_ids'].numel():.0f} % real "
            f"tokens stored), median {results[name]:,.0f} real tokens/s of {args.repeats}, held-out "
            f"loss {losses[name]:.3f}"
        )
    print(f"packed / padded per batch tokens/s: {results['packed'] / results['padded per batch']:.2f}x")
    print(f"packed / padded to block_size tokens/s: {results['packed'] / results['padded']:.2f}x")


if __name__ == "__main__":
    main()
