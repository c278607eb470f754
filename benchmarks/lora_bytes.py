"""Bytes a LoRA fine-tune moves per step and keeps per checkpoint against a full fine-tune of
the same Hugging Face GPT-2, as sparkdp's strategies count them (their CommMeter formulas) and
as its checkpoints hold the model (the safetensors bytes of what a checkpoint saves).

    python benchmarks/lora_bytes.py [--layers 12] [--width 768] [--rank 8] [--workers 2]

GPT-2 small by default (built from a config: nothing downloaded), LoRA r=8 on c_attn, c_proj
and c_fc; fsdp with bf16-mixed gathers in bf16 and reduces in fp32, a frozen base stored in bf16.
"""

from __future__ import annotations

import argparse

import torch

from sparkdp.frozen import store_frozen_in, trainable_state
from sparkdp.state import state_to_bytes
from sparkdp.strategies.base import ring_bytes
from sparkdp.strategies.fsdp import FSDP


def lora_config(rank: int):
    """LoRA of rank ``rank`` on GPT-2's attention and MLP projections (Conv1D: fan_in_fan_out)."""
    import peft

    return peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True
    )


def models(layers: int, width: int, rank: int):
    import peft
    import transformers

    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64))
    full = transformers.GPT2LMHeadModel(config)
    lora = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora_config(rank))
    return full, lora


def per_step(model: torch.nn.Module, workers: int, gathered: torch.dtype = torch.bfloat16) -> dict[str, int]:
    """Bytes a worker sends per step under each strategy; ``gathered``: the dtype fsdp all-gathers
    in (bfloat16 under bf16-mixed, float32 under precision 32) and a frozen base is stored in."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * 4 for p in trainable)
    fsdp = FSDP()
    fsdp.mixed_precision(None if gathered == torch.float32 else gathered)
    size = gathered.itemsize
    frozen = sum(p.numel() * size * 2 for p in model.parameters() if not p.requires_grad)  # fwd + bwd
    values = sum(p.numel() for p in trainable)
    return {
        "allreduce": ring_bytes(grads, workers),  # DDP buckets: trainable gradients only
        "average": ring_bytes(grads, workers),  # one averaging round of the trainable parameters
        "fsdp": fsdp.wire_bytes(values, size * 2, workers, frozen),
    }


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """The safetensors bytes of the model state a checkpoint (and fit's result) keeps: the
    trainable part of a model with a frozen base, else all of it."""
    return len(state_to_bytes(trainable_state(model, model.state_dict())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    full, lora = models(args.layers, args.width, args.rank)
    store_frozen_in(lora, torch.bfloat16)
    print("| | full fine-tune | LoRA | LoRA / full |\n|---|---:|---:|---:|")
    steps_full, steps_lora = per_step(full, args.workers), per_step(lora, args.workers)
    for name in steps_full:
        a, b = steps_full[name], steps_lora[name]
        print(f"| {name}: bytes sent per worker per step | {a:,} | {b:,} | {b / a:.2%} |")
    a, b = checkpoint_bytes(full), checkpoint_bytes(lora)
    print(f"| checkpoint / result model state | {a:,} | {b:,} | {b / a:.2%} |")


if __name__ == "__main__":
    main()
