"""Text columns tokenized on the executors and packed into language-model blocks.

``tokenize_blocks(df, "text", tokenizer, block_size=256)`` is a lazy DataFrame of
``input_ids`` and ``labels`` (``array<bigint>``, ``block_size`` long, equal: the model
shifts the labels) built by one ``mapInArrow`` stage: every task decodes its Arrow batches'
strings, tokenizes them with the Hugging Face ``tokenizers`` library (``encode_batch``, in
Rust, on the executor's cores) and packs them as :mod:`sparkdp.data.text` describes. It
streams into ``sparkdp.fit`` like any other DataFrame, or can be written to Parquet once.

Packing is per partition: the documents of one partition are concatenated in order, each
followed by the end-of-text token, and the tokens after the partition's last whole block
are dropped (fewer than ``block_size`` per partition; repartition into fewer, larger
partitions when that matters). Blocks never mix documents of two partitions, so the result
does not depend on how Spark schedules the tasks. Null texts are skipped.

The tokenizer travels in the task closure as its JSON serialisation (a ``str``); each task
rebuilds it with ``Tokenizer.from_str``. Nothing else of the caller's is pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..data.text import (
    BlockPacker,
    PackCounts,
    blocks_batch,
    check_block_size,
    encode_texts,
    eos_id_of,
    require_tokenizers,
    tokenizer_json,
)
from ..errors import ConfigError
from .sft import example_counts, tokenize_examples  # fine-tuning examples: their own module

__all__ = ["example_counts", "tokenize_blocks", "tokenize_examples"]

log = logging.getLogger(__name__)

SCHEMA = "input_ids array<bigint>, labels array<bigint>"
#: count_blocks' rows: one partition's PackCounts
COUNTS_SCHEMA = ", ".join(f"{name} bigint" for name in PackCounts.__dataclass_fields__)
_COUNTS_ARROW = pa.schema([(name, pa.int64()) for name in PackCounts.__dataclass_fields__])


def tokenize_blocks(
    df: Any, column: str, tokenizer: Any, block_size: int, *, eos_token: str | None = None
) -> Any:
    """``df[column]``'s texts as packed token blocks: a DataFrame of ``input_ids`` and ``labels``.

    Args:
        df: a Spark DataFrame (or ``spark.read.parquet(...)``) with a string column.
        column: the text column; each row is one document.
        tokenizer: a ``tokenizers.Tokenizer``, a Hugging Face fast tokenizer, or a tokenizer.json path.
        block_size: tokens per block (the model's context length).
        eos_token: the token put after every document; by default the first of
            ``<|endoftext|>``, ``</s>``, ``<eos>``, ``[SEP]``, ``<|end_of_text|>`` the vocabulary has.
    """
    tok_json, eos_id = _prepared(df, column, tokenizer, block_size, eos_token)
    return df.select(column).mapInArrow(_block_stage(tok_json, column, block_size, eos_id), SCHEMA)


def count_blocks(
    df: Any, column: str, tokenizer: Any, block_size: int, *, eos_token: str | None = None
) -> PackCounts:
    """What :func:`tokenize_blocks` with the same arguments does with ``df``'s documents, counted
    by one Spark job that tokenizes and packs them as it does and keeps only the counts: blocks,
    documents packed, null or empty ones skipped, and those truncated (with tokens in a
    partition's dropped tail). The counts are logged in one line and returned."""
    tok_json, eos_id = _prepared(df, column, tokenizer, block_size, eos_token)
    stage = _block_stage(tok_json, column, block_size, eos_id, counting=True)
    rows = df.select(column).mapInArrow(stage, COUNTS_SCHEMA).collect()
    counts = sum((PackCounts(*(int(v) for v in row)) for row in rows), PackCounts())
    log.info("tokenize_blocks(%r, block_size=%d): %s", column, block_size, counts.describe())
    return counts


def _prepared(
    df: Any, column: str, tokenizer: Any, block_size: int, eos_token: str | None
) -> tuple[str, int]:
    """The tokenizer's JSON and the separator's id, once the arguments are checked."""
    check_block_size(block_size)
    fields = {f.name: f for f in df.schema.fields}
    if column not in fields:
        raise ConfigError(
            f"tokenize_blocks: the DataFrame has no column {column!r}; its columns: "
            f"{', '.join(fields) or 'none'}."
        )
    if fields[column].dataType.typeName() != "string":
        raise ConfigError(
            f"tokenize_blocks: column {column!r} holds {fields[column].dataType.simpleString()}, "
            f"not text; give a string column (cast binary with .cast('string') if it is UTF-8)."
        )
    tok_json = tokenizer_json(tokenizer)
    eos_id = eos_id_of(require_tokenizers().Tokenizer.from_str(tok_json), eos_token)
    return tok_json, eos_id


def _block_stage(tok_json: str, column: str, block_size: int, eos_id: int, counting: bool = False):
    """The mapInArrow function; it closes over plain values only (a str, ints and a bool).
    ``counting``: one row of the partition's :class:`PackCounts` instead of the blocks."""

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tokenizer = require_tokenizers().Tokenizer.from_str(tok_json)
        packer = BlockPacker(block_size, eos_id)
        for batch in batches:
            texts = [t for t in batch.column(column).to_pylist() if t is not None]
            packer.skip(batch.num_rows - len(texts))
            blocks = packer.add(encode_texts(tokenizer, texts))
            if len(blocks) and not counting:
                yield blocks_batch(blocks)
        # packer.tail: fewer than block_size tokens, dropped (see the module's docstring)
        if counting:
            counts = packer.finish()
            yield pa.RecordBatch.from_pydict(
                {name: [getattr(counts, name)] for name in PackCounts.__dataclass_fields__},
                schema=_COUNTS_ARROW,
            )

    return stage
