"""What the Hugging Face scripts share: a tiny GPT-2 from a config, the local tokenizer, token
blocks of a local text file (nothing downloaded), and each rank's view of its place."""

from __future__ import annotations

import json
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

BLOCK = 16
PLACE = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
)


def tiny_model(tokenizer: PreTrainedTokenizerFast) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=BLOCK,
        n_embd=32,
        n_layer=1,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return GPT2LMHeadModel(config)


class Blocks(torch.utils.data.Dataset):
    """The text's tokens cut into blocks; labels are the inputs (the model shifts them)."""

    def __init__(self, ids: list[int]) -> None:
        self.blocks = [ids[i : i + BLOCK] for i in range(0, len(ids) - BLOCK + 1, BLOCK)]

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.blocks[i])
        return {"input_ids": ids, "labels": ids.clone()}


def tokenized(tokenizer: PreTrainedTokenizerFast, text_path: str, cache: str) -> list[int]:
    """The text's token ids, cached in a file the local main process writes first (what a
    ``datasets`` cache does): the others read the finished file."""
    if not os.path.exists(cache):
        with open(text_path) as f:
            ids = tokenizer(f.read())["input_ids"]
        with open(cache, "x") as f:  # "x": a second writer would fail here
            json.dump(ids, f)
    with open(cache) as f:
        return json.load(f)


def write_view(out_dir: str, **seen: object) -> None:
    view = {name: os.environ.get(name) for name in PLACE} | seen
    with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(view, f)
