"""Fine-tuning examples from a table, tokenized on the executors (``tokenize_examples``).

One ``mapInArrow`` stage, as ``tokenize_blocks``: every task rebuilds the tokenizer from its
JSON serialisation, encodes its rows' prompt and completion (or renders their conversations with
the chat template), masks what is not trained and packs the examples as
:mod:`sparkdp.data.sft` describes. The chat template travels as its Jinja source (a ``str``) and
is rendered by transformers' ``apply_chat_template`` (a sandboxed Jinja environment) on a
``PreTrainedTokenizerFast`` built from the same JSON; nothing of the caller's is pickled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..data.sft import (
    COUNT_COLUMNS,
    PACKED_COLUMNS,
    PADDED_COLUMNS,
    ExamplePacker,
    chat_segments,
    check_too_long,
)
from ..data.sft import encode_segments as _encode
from ..data.text import check_block_size, eos_id_of, require_tokenizers, tokenizer_json
from ..errors import ConfigError

log = logging.getLogger(__name__)


def tokenize_examples(
    df: Any,
    *,
    tokenizer: Any,
    block_size: int,
    prompt: str | None = None,
    completion: str | None = None,
    messages: str | None = None,
    chat_template: str | None = None,
    packing: bool = True,
    too_long: str = "truncate",
    eos_token: str | None = None,
) -> Any:
    """Prompt/completion pairs or conversations as training rows for ``fit(dict_batches=True,
    loss="model")``, with the prompt masked out of the loss (labels -100).

    Args:
        df: a Spark DataFrame.
        tokenizer: a ``tokenizers.Tokenizer``, a Hugging Face fast tokenizer or a tokenizer.json path.
        block_size: tokens per row (at most the model's context length).
        prompt, completion: string columns; the completion is trained, followed by the
            end-of-text token. Give both, or ``messages``.
        messages: a column of conversations (``array<struct<role: string, content: string>>``)
            rendered with the chat template; the assistant turns are trained.
        chat_template: the Jinja template for ``messages``; by default the tokenizer's own
            (a transformers tokenizer's ``chat_template``).
        packing: several examples per row with ``position_ids`` restarting at each (the model
            keeps them apart: ``fit`` checks it does); False: one example per right-padded row
            with an ``attention_mask``.
        too_long: ``"truncate"`` an example longer than ``block_size`` to its first tokens, or
            ``"drop"`` it. Both are counted (:func:`example_counts`).
        eos_token: ends each completion, and pads; by default the vocabulary's usual one.

    Returns:
        A lazy DataFrame of ``input_ids``, ``labels`` and ``position_ids`` (packed) or
        ``attention_mask`` (padded), each ``array<bigint>`` of ``block_size``, and the counts
        ``examples``, ``truncated``, ``dropped`` per row. Pass
        ``features=["input_ids", "labels", "position_ids"]`` (or ``"attention_mask"``) to ``fit``.
    """
    check_block_size(block_size)
    check_too_long(too_long)
    if not isinstance(packing, bool):
        raise ConfigError(f"tokenize_examples: packing must be True or False; got {packing!r}.")
    columns = _columns(df, prompt, completion, messages)
    tok_json = tokenizer_json(tokenizer)
    eos_id = eos_id_of(require_tokenizers().Tokenizer.from_str(tok_json), eos_token)
    template = None
    if messages is not None:
        template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ConfigError(
                "tokenize_examples: messages need a chat template; pass chat_template= (its Jinja "
                "source) or a transformers tokenizer that has one."
            )
    stage = _example_stage(tok_json, template, columns, block_size, eos_id, packing, too_long)
    names = (PACKED_COLUMNS if packing else PADDED_COLUMNS) + COUNT_COLUMNS
    schema = ", ".join([f"{n} array<bigint>" for n in names[:3]] + [f"{n} bigint" for n in names[3:]])
    return df.select(*columns).mapInArrow(stage, schema)


def example_counts(rows: Any) -> dict[str, int]:
    """How many examples ``tokenize_examples`` kept, truncated and dropped, and in how many rows
    (one Spark job over ``rows``); logged as one line."""
    from pyspark.sql import functions as F

    got = rows.agg(F.count("*").alias("rows"), *[F.sum(c).alias(c) for c in COUNT_COLUMNS]).collect()[0]
    counts = {k: int(got[k] or 0) for k in ("rows", *COUNT_COLUMNS)}
    log.info(
        "tokenize_examples: %d example(s) in %d row(s); %d truncated, %d dropped",
        counts["examples"],
        counts["rows"],
        counts["truncated"],
        counts["dropped"],
    )
    return counts


def _columns(df: Any, prompt: str | None, completion: str | None, messages: str | None) -> list[str]:
    pair = prompt is not None or completion is not None
    if pair == (messages is not None) or (pair and (prompt is None or completion is None)):
        raise ConfigError(
            "tokenize_examples takes prompt= and completion= (two string columns) or messages= "
            "(a column of conversations); give one of the two."
        )
    fields = {f.name: f.dataType for f in df.schema.fields}
    wanted = [c for c in (prompt, completion, messages) if c is not None]
    for name in wanted:
        if name not in fields:
            raise ConfigError(
                f"tokenize_examples: the DataFrame has no column {name!r}; its columns: "
                f"{', '.join(fields) or 'none'}."
            )
        kind = fields[name].simpleString()
        ok = kind.startswith("array<struct<") if name == messages else kind == "string"
        if not ok:
            need = "array<struct<role:string,content:string>>" if name == messages else "string"
            raise ConfigError(f"tokenize_examples: column {name!r} holds {kind}; it must be {need}.")
    return wanted


def _example_stage(
    tok_json: str,
    template: str | None,
    columns: list[str],
    block_size: int,
    eos_id: int,
    packing: bool,
    too_long: str,
):
    """The mapInArrow function; it closes over plain values only (strs, ints, bools)."""

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        tokenizer = require_tokenizers().Tokenizer.from_str(tok_json)
        renderer = _renderer(tok_json, template) if template is not None else None
        eos = tokenizer.id_to_token(eos_id)
        packer = ExamplePacker(block_size, eos_id, packing, too_long)
        for batch in batches:
            if renderer is not None:
                conversations = [c for c in batch.column(0).to_pylist() if c]
                examples = [_encode(tokenizer, chat_segments(renderer, c)) for c in conversations]
            else:
                pairs = zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
                whole = [(p, c) for p, c in pairs if p is not None and c is not None]
                examples = [_encode(tokenizer, [(p, False), (c + eos, True)]) for p, c in whole]
            packer.skip(batch.num_rows - len(examples))  # null rows
            out = packer.add(examples)
            if out is not None:
                yield out
        last = packer.finish()
        if last is not None:
            yield last
        if packer.unreported:
            log.warning("tokenize_examples: a partition kept no example; %d dropped", packer.unreported)

    return stage


def _renderer(tok_json: str, template: str) -> Any:
    """A transformers fast tokenizer over the same JSON, holding the chat template."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:  # an optional dependency
        raise ConfigError(
            "tokenize_examples(messages=...) renders chat templates with transformers: "
            "pip install 'sparkdp[hf]'."
        ) from err
    renderer = PreTrainedTokenizerFast(tokenizer_object=require_tokenizers().Tokenizer.from_str(tok_json))
    renderer.chat_template = template
    return renderer


__all__ = ["example_counts", "tokenize_examples"]
