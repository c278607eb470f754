"""Tiny models for the language-model tests: a causal LM computing its own loss the way
Hugging Face's *ForCausalLM models do (labels shifted inside, -100 ignored)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, LENGTH = 11, 6


class TinyCausalLM(nn.Module):
    """Embedding -> linear -> vocabulary logits; ``.loss`` when given labels (or a dict ``{"loss": ...}``
    with ``as_dict``). Records the dtype its matmul computed in (autocast checks)."""

    def __init__(self, as_dict: bool = False, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 8)
        self.hidden = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB)
        self.as_dict = as_dict
        self.seen_dtype: torch.dtype | None = None

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = torch.tanh(self.hidden(self.embed(input_ids)))
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1).to(h.dtype)
        logits = self.head(h)
        self.seen_dtype = logits.dtype
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, VOCAB).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        if self.as_dict:
            return {"loss": loss, "logits": logits}
        return SimpleNamespace(loss=loss, logits=logits)


def token_data(rows: int = 32, seed: int = 0, pad_tail: bool = True) -> dict[str, torch.Tensor]:
    """input_ids / attention_mask / labels; with ``pad_tail`` the last two positions of odd rows are
    padding (mask 0, label -100), so rows hold different numbers of counted tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, LENGTH), generator=g)
    mask = torch.ones(rows, LENGTH, dtype=torch.int64)
    labels = ids.clone()
    if pad_tail:
        mask[1::2, -2:] = 0
        labels[1::2, -2:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
