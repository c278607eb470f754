"""The helpers the language-model benchmarks share (``benchmarks/common.py``'s interleaved ways,
``benchmarks/lora_bytes.py``'s byte formulas), against hand-worked numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from common import paired_ratios, ratio_check, summarize_ways  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_paired_ratios_pair_each_repeat_and_skip_failed_runs():
    runs = {
        "a": [{"ok": True, "tokens_per_s": 300.0}, {"ok": False}, {"ok": True, "tokens_per_s": 100.0}],
        "b": [
            {"ok": True, "tokens_per_s": 200.0},
            {"ok": True, "tokens_per_s": 50.0},
            {"ok": True, "tokens_per_s": 400.0},
        ],
    }
    assert paired_ratios(runs, "a", "b") == [1.5, 0.25]
    assert paired_ratios(runs, "a", "missing") == []
    check = ratio_check("a / b", [1.5, 0.25, 1.0])
    assert check["value"] == 1.0 and check["display"] == "1.000x (repeats: 1.500, 0.250, 1.000)"


def test_summarize_ways_takes_medians_of_the_good_runs_and_keeps_the_first_error():
    runs = {
        "x": [
            {"ok": True, "tokens_per_s": 10.0, "tokens": 640},
            {"ok": False, "error": "timed out"},
            {"ok": True, "tokens_per_s": 30.0, "tokens": 640},
            {"ok": True, "tokens_per_s": 26.0, "tokens": 640},
        ]
    }
    got = summarize_ways(runs, ("tokens_per_s", "loss"))["x"]
    assert got == {
        "ok_runs": 3,
        "runs": 4,
        "tokens_per_s": 26.0,
        "loss": None,
        "tokens": 640,
        "error": "timed out",
    }


def _gpt2_and_lora():
    pytest.importorskip("peft")
    import peft
    import transformers
    from lora_bytes import lora_config

    config = transformers.GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    lora = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora_config(2))
    return transformers.GPT2LMHeadModel(config), lora


def test_lora_bytes_per_step_follows_the_gathered_dtype():
    from lora_bytes import checkpoint_bytes, per_step

    full, lora = _gpt2_and_lora()
    # LoRA r=2 on one layer: c_attn 2 x (16 + 48), attn c_proj 2 x (16 + 16), c_fc 2 x (16 + 64),
    # mlp c_proj 2 x (64 + 16)
    adapters = 2 * (64 + 32 + 80 + 80)
    assert sum(p.numel() for p in lora.parameters() if p.requires_grad) == adapters
    frozen = sum(p.numel() for p in lora.parameters() if not p.requires_grad)
    fp32, bf16 = per_step(lora, 2, torch.float32), per_step(lora, 2, torch.bfloat16)
    # two workers: a ring all-reduce sends the whole gradient once; fsdp sends half of its
    # all-gathers (forward and backward) and of its fp32 reduce-scatter
    assert fp32["allreduce"] == bf16["allreduce"] == 4 * adapters
    assert fp32["fsdp"] == (adapters * (2 * 4 + 4) + frozen * 2 * 4) // 2
    assert bf16["fsdp"] == (adapters * (2 * 2 + 4) + frozen * 2 * 2) // 2
    full_values = sum(p.numel() for p in full.parameters())
    assert per_step(full, 2, torch.float32)["fsdp"] == full_values * (2 * 4 + 4) // 2
    # the checkpoint keeps the adapters only: their float32 bytes and a small header each
    assert 4 * adapters < checkpoint_bytes(lora) < 4 * adapters + 4096
    assert checkpoint_bytes(full) > 4 * full_values
