"""A tiny Hugging Face GPT-2 saved as a local "pretrained" directory (built from a config:
nothing downloaded) and token blocks it can learn, for the model-source and command-line tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

VOCAB, POSITIONS = 64, 16


def tiny_gpt2_dir(where: Path, *, vocab: int = VOCAB, positions: int = POSITIONS, seed: int = 0) -> Path:
    """``save_pretrained`` of a 1-layer GPT-2 (safetensors weights, config.json) into ``where``."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(where)
    return where


def counting_blocks(rows: int, length: int = POSITIONS, *, vocab: int = VOCAB, seed: int = 0) -> np.ndarray:
    """``rows`` blocks of ``length`` ids counting up by one from a random start (mod ``vocab``):
    each next token follows from the one before, so a model that learns beats ln(vocab)."""
    starts = np.random.default_rng(seed).integers(0, vocab, size=(rows, 1))
    return (starts + np.arange(length)) % vocab


def hf_loss(model: torch.nn.Module, blocks: np.ndarray) -> float:
    """The model's own mean loss over ``blocks`` (labels = input_ids), by Hugging Face's forward."""
    ids = torch.as_tensor(blocks, dtype=torch.int64)
    model.eval()
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


def lm_job(tmp: Path, *, lr: str) -> tuple[Path, list]:
    """The tiny GPT-2 of ``tiny_gpt2_dir`` in ``tmp/gpt2`` and its train/eval block tables, and the
    ``sparkdp train`` flags that fine-tune it on them with its own loss on 2 workers for 3 epochs,
    with a run log (``tmp/run``), a summary (``tmp/summary.json``) and checkpoints (``tmp/ckpt``)."""
    from sparkdp.data.text import write_blocks

    model = tiny_gpt2_dir(tmp / "gpt2")
    write_blocks(counting_blocks(64), tmp / "train.parquet")
    write_blocks(counting_blocks(16, seed=1), tmp / "eval.parquet")
    flags = [
        "--hf-model", model,
        "--data", tmp / "train.parquet",
        "--eval-data", tmp / "eval.parquet",
        "--features", "input_ids,labels",
        "--dict-batches",
        "--workers", "2",
        "--epochs", "3",
        "--batch-size", "8",
        "--optimizer", "adamw",
        "--lr", lr,
        "-q",
        "--out", tmp / "run",
        "--json-out", tmp / "summary.json",
        "--checkpoint-dir", tmp / "ckpt",
    ]  # fmt: skip
    return model, flags
