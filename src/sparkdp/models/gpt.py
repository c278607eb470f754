"""A small decoder-only transformer language model (GPT-2's layout, pre-norm).

Token and learned position embeddings, ``n_layer`` :class:`GPTBlock` s (LayerNorm ->
causal self-attention -> residual; LayerNorm -> GELU MLP -> residual), a final LayerNorm
and an output head tied to the token embedding. Attention is
``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel
(flash / memory-efficient on CUDA) where one applies.

``forward(input_ids, labels=None, attention_mask=None)`` returns a :class:`CausalLMOutput`
with ``logits`` and, given labels, ``loss``: the mean next-token cross entropy, the labels
shifted inside (position t predicts ``labels[t + 1]``) and positions labelled -100 left out,
as Hugging Face causal language models do. The blocks are their own class so a sharding
wrap policy can find them by type.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError

IGNORE_INDEX = -100


class CausalLMOutput(dict):
    """``logits`` and (given labels) ``loss``, readable as attributes or keys.

    A dict, so DDP, ``torch.compile`` and Hugging Face-style ``outputs["loss"]`` all see the
    tensors inside.
    """

    @property
    def logits(self) -> Tensor:
        return self["logits"]

    @property
    def loss(self) -> Tensor | None:
        return self.get("loss")


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in self.qkv(x).split(d, dim=2)
        )
        p = self.dropout if self.training else 0.0
        if key_mask is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # padding: causal and the key is a real token (or the query itself, so no row is empty)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            allowed = (causal & key_mask[:, None, None, :]) | torch.eye(t, dtype=torch.bool, device=x.device)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class GPTBlock(nn.Module):
    """One pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln_1(x), key_mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only language model over ``vocab_size`` tokens and contexts of up to ``block_size``."""

    def __init__(
        self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("block_size", block_size),
            ("n_layer", n_layer),
            ("n_head", n_head),
            ("d_model", d_model),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"gpt: {name} must be a positive integer; got {value!r}.")
        if d_model % n_head:
            raise ConfigError(
                f"gpt: d_model ({d_model}) must be a multiple of n_head ({n_head}): "
                f"each head gets d_model / n_head dimensions."
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"gpt: dropout must be in [0, 1); got {dropout!r}.")
        self.vocab_size, self.block_size = vocab_size, block_size
        #: the constructor's arguments: what rebuilds this architecture (model.json, checkpoints,
        #: the Hugging Face export in sparkdp.export)
        self.arguments: dict[str, Any] = {
            "vocab_size": vocab_size,
            "block_size": block_size,
            "n_layer": n_layer,
            "n_head": n_head,
            "d_model": d_model,
            "dropout": dropout,
        }
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix embeds tokens and scores them
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        # GPT-2's initialisation: N(0, 0.02), the residual projections scaled by 1/sqrt(2 * n_layer)
        # so the residual stream's variance does not grow with depth
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for module in self.modules():
            if isinstance(module, GPTBlock):
                for proj in (module.attn.proj, module.mlp.proj):
                    nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * n_layer))

    def forward(
        self, input_ids: Tensor, labels: Tensor | None = None, attention_mask: Tensor | None = None
    ) -> CausalLMOutput:
        if input_ids.dim() != 2:
            raise ValueError(
                f"gpt: input_ids must be (batch, sequence) token ids; got shape {tuple(input_ids.shape)}."
            )
        t = input_ids.shape[1]
        if t > self.block_size:
            raise ValueError(
                f"gpt: sequences of {t} tokens exceed block_size {self.block_size}; "
                f"cut the text into blocks of at most {self.block_size} or build a larger model."
            )
        positions = torch.arange(t, device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        key_mask = None if attention_mask is None else attention_mask.to(torch.bool)
        for block in self.blocks:
            x = block(x, key_mask)
        logits = self.lm_head(self.ln_f(x))
        out = CausalLMOutput(logits=logits)
        if labels is not None:
            out["loss"] = causal_lm_loss(logits, labels)
        return out


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross entropy of position t's logits against ``labels[t + 1]``, -100 labels left out."""
    shifted = labels[:, 1:].reshape(-1).to(torch.long)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), shifted, ignore_index=IGNORE_INDEX
    )


def gpt(
    vocab_size: int = 8192,
    block_size: int = 256,
    n_layer: int = 6,
    n_head: int = 6,
    d_model: int = 384,
    dropout: float = 0.0,
    **unknown: Any,
) -> GPT:
    if unknown:
        raise ConfigError(
            f"gpt takes vocab_size, block_size, n_layer, n_head, d_model and dropout; "
            f"got unknown option(s) {', '.join(sorted(unknown))}."
        )
    return GPT(vocab_size, block_size, n_layer, n_head, d_model, dropout)
