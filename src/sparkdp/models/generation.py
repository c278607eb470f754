"""Batched text generation with a Hugging Face causal LM: prompts left-padded, greedy or sampled.

Greedy decoding is ``model.generate(do_sample=False)`` itself. Sampling goes through the same
greedy loop with one more logits processor, :class:`RowSampler`, last in the list: it applies
temperature, top-k and top-p with transformers' own warpers, draws each row's token from that
row's own ``torch.Generator`` and leaves only the drawn token finite, so greedy picks it. A row
therefore draws the same tokens whichever rows share its batch, partition or executor: its
generator is seeded by :func:`row_seed` from the job's seed and the row's key. (Hugging Face's
own sampling draws a whole batch from one generator, so a row's text would depend on its
neighbours.)

Only ``input_ids`` and ``attention_mask`` reach the model: a tokenizer's ``token_type_ids``
would be embedded by GPT-2 and derail generation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from ..config import GenerationConfig
from ..errors import DataError


def row_seed(seed: int, key: str) -> int:
    """A 63-bit seed for one row from the job's seed and the row's key (its prompt by default)."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class RowSampler:
    """A logits processor that samples every row from its own generator (see the module docstring)."""

    def __init__(self, seeds: Sequence[int], config: GenerationConfig, device: torch.device) -> None:
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.warpers: list[Any] = []
        if config.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(config.temperature)))
        if config.top_k:
            self.warpers.append(TopKLogitsWarper(config.top_k))
        if config.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(float(config.top_p)))
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        probs = torch.softmax(scores.float(), dim=-1)
        drawn = torch.cat(
            [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(self.generators)]
        )
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, drawn[:, None], 0.0)


def left_pad(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``: the rows right-aligned, pad tokens masked out on the left."""
    width = max(len(row) for row in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, row in enumerate(ids):
        if row:
            input_ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return input_ids, mask


def special_ids(model: Any) -> tuple[int, list[int]]:
    """``(pad id, end-of-text ids)`` from the model's generation config (pad: the first EOS, else 0)."""
    config = model.generation_config
    eos = config.eos_token_id
    eos_ids = [] if eos is None else [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
    pad = config.pad_token_id
    return (int(pad) if pad is not None else eos_ids[0] if eos_ids else 0), eos_ids


def _until_eos(row: list[int], eos_ids: list[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[:i]
    return row


@torch.inference_mode()  # (no autograd bookkeeping at all: a little less per step than no_grad)
def generate_ids(
    model: Any, prompts: Sequence[Sequence[int]], config: GenerationConfig, seeds: Sequence[int]
) -> list[list[int]]:
    """Each prompt's completion (token ids, without the prompt and the end-of-text token), in
    batches of ``config.batch_size`` prompts of similar length."""
    from transformers import LogitsProcessorList

    pad_id, eos_ids = special_ids(model)
    device = next(model.parameters()).device
    limit = getattr(model.config, "max_position_embeddings", None)
    for i, row in enumerate(prompts):
        if not row:
            raise DataError(f"prompt {i} of this batch encodes to no tokens; drop empty prompts first.")
        if limit is not None and len(row) + config.max_new_tokens > limit:
            raise DataError(
                f"a prompt of {len(row)} tokens plus max_new_tokens={config.max_new_tokens} exceeds the "
                f"model's {limit} positions; lower max_new_tokens or shorten the prompts."
            )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding per batch
    out: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), config.batch_size):
        rows = order[start : start + config.batch_size]
        input_ids, mask = left_pad([prompts[i] for i in rows], pad_id)
        options: dict[str, Any] = {}
        if config.do_sample:
            sampler = RowSampler([seeds[i] for i in rows], config, device)
            options["logits_processor"] = LogitsProcessorList([sampler])
        generated = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=config.max_new_tokens,
            do_sample=False,
            num_beams=1,
            pad_token_id=pad_id,
            eos_token_id=eos_ids or None,
            **options,
        )
        for i, completion in zip(rows, generated[:, input_ids.shape[1] :].tolist(), strict=True):
            out[i] = _until_eos(completion, eos_ids)
    return out


def generate_texts(
    model: Any, tokenizer: Any, prompts: Sequence[str], config: GenerationConfig, keys: Sequence[str]
) -> list[str]:
    """The completions of ``prompts`` as text; ``tokenizer`` is a ``tokenizers.Tokenizer``."""
    encoded = [e.ids for e in tokenizer.encode_batch(list(prompts))]
    seeds = [row_seed(config.seed, key) for key in keys]
    completions = generate_ids(model, encoded, config, seeds)
    return list(tokenizer.decode_batch(completions, skip_special_tokens=True))


__all__ = ["RowSampler", "generate_ids", "generate_texts", "left_pad", "row_seed", "special_ids"]
