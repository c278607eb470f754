"""``sparkdp train --dataset fortunes --model gpt``: a built-in text corpus for a built-in language model.

The corpus is tokenized with a tokenizer of the model's vocabulary size and packed into
blocks of its context length; both splits are written once as Parquet files of
``input_ids`` and ``labels`` under the cache directory, and the job trains on them with the
model's own loss (``loss="model"``), the two columns arriving as the model's keyword arguments.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass
from typing import Any

from ..data.text import BLOCK_COLUMNS, write_blocks
from ..data.text_datasets import load_text_dataset
from ..errors import ConfigError
from ..files import cache_dir
from ..models import MODELS
from ..models.gpt import gpt


@dataclass(frozen=True)
class TextJob:
    model_args: dict[str, Any]  # the model's options, vocab_size and block_size filled in
    data: str  # the training blocks (Parquet)
    eval_data: str  # the validation blocks (Parquet)
    columns: dict[str, Any]  # fit's column settings for them


def text_job(dataset: str, model: str, model_args: dict[str, Any], limit: int | None) -> TextJob:
    entry = MODELS.get(model)
    if entry.factory is not gpt:
        language_models = ", ".join(e.name for e in MODELS if e.factory is gpt)
        raise ConfigError(
            f"the text corpus {dataset!r} trains a language model: --model {language_models} (not {model!r})."
        )
    defaults = {
        name: p.default
        for name, p in inspect.signature(gpt).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    sizes = {
        key: model_args.get(key, entry.preset.get(key, defaults[key])) for key in ("vocab_size", "block_size")
    }
    ds = load_text_dataset(dataset, limit=limit, **sizes)
    if not len(ds.train_blocks) or not len(ds.validation_blocks):
        raise ConfigError(
            f"{dataset} with --limit {limit} has too little text for one block of "
            f"{sizes['block_size']} tokens in each split; raise --limit or lower block_size."
        )
    digest = hashlib.sha256(ds.train_blocks.tobytes() + b"|" + ds.validation_blocks.tobytes()).hexdigest()[
        :16
    ]
    where = cache_dir() / "blocks" / f"{dataset}-{sizes['vocab_size']}-{sizes['block_size']}-{digest}"
    train, validation = where / "train.parquet", where / "validation.parquet"
    for path, blocks in ((train, ds.train_blocks), (validation, ds.validation_blocks)):
        if not path.is_file():
            write_blocks(blocks, path)
    return TextJob(
        {**model_args, **sizes},
        str(train),
        str(validation),
        {"features": list(BLOCK_COLUMNS), "dict_batches": True},
    )
