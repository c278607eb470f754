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
