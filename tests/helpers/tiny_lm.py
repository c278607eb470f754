"""A small Hugging Face GPT-2 that has learnt a little English-like text, and its tokenizer: built
offline (a byte-level BPE tokenizer trained by sparkdp, a GPT2Config, 150 AdamW steps on the
texts), saved with ``save_pretrained`` for the generation and scoring tests. Trained, not random:
a random model's next-token scores are nearly flat, so greedy ties would make equal outputs luck.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sparkdp.data.text import EOS_TOKEN, encode_texts, pack_documents, train_bpe_tokenizer

_WORDS = (
    "the cat sat on a mat and the dog ran to the park while a bird sang in the old tree "
    "near the river where children play every sunny day after school with their friends"
).split()

PROMPTS = (
    "the cat",
    "a bird sang in the old",
    "children play",
    "the dog ran to the park while a bird",
    "river",
    "near the river where children play every sunny",
)


def corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Sentences of 4-14 consecutive words of one looping text: learnable, not constant."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        start, length = int(rng.integers(len(_WORDS))), int(rng.integers(4, 15))
        out.append(" ".join(_WORDS[(start + k) % len(_WORDS)] for k in range(length)))
    return out


@dataclass(frozen=True)
class TinyLM:
    model: torch.nn.Module  # a transformers GPT2LMHeadModel, eval mode
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    directory: Path


@functools.cache
def _trained(steps: int) -> tuple[dict, object, dict]:
    import transformers

    texts = corpus()
    raw = train_bpe_tokenizer(texts, 340)
    eos = raw.token_to_id(EOS_TOKEN)
    config = transformers.GPT2Config(
        vocab_size=raw.get_vocab_size(),
        n_positions=64,
        n_embd=48,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    blocks = torch.from_numpy(pack_documents(encode_texts(raw, texts), 32, eos))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        batch = blocks[(step * 16) % len(blocks) :][:16]
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict(), raw, config.to_dict()


def tiny_lm(directory: Path, steps: int = 150) -> TinyLM:
    """The trained model and its tokenizer, saved with save_pretrained into ``directory``."""
    import transformers

    state, raw, config = _trained(steps)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    model.load_state_dict(state)
    model.eval()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return TinyLM(model, tokenizer, Path(directory))


def hf_greedy(lm: TinyLM, prompt: str, max_new_tokens: int) -> str:
    """Hugging Face's own greedy generation of one prompt (no padding), its completion decoded."""
    enc = lm.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = lm.model.generate(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=lm.tokenizer.pad_token_id,
        )
    return lm.tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
