"""Supervised fine-tuning examples as training rows: the prompt masked out of the loss, and
several examples packed into one row without attending to each other.

An example is a list of text segments, each trained or not: a prompt (not trained) and its
completion (trained, followed by the end-of-text token), or a conversation rendered by a chat
template, whose assistant turns are trained (:func:`chat_segments`). Its tokens' labels are
their ids where trained and -100 elsewhere; its first token's label is -100 as well, so that in
a packed row no example's last token is trained to predict the next example's first.

:class:`ExamplePacker` turns examples into rows of ``block_size`` tokens:

* ``packing=True``: examples end to end, a new row when the next one does not fit, the rest of
  a row padded; ``position_ids`` restart at 0 with every example (and with the padding, which
  is its own sequence with labels -100). A Hugging Face model (transformers 5) derives a
  block-diagonal causal mask from such positions when it gets no ``attention_mask``, so no
  token attends to another example's (``train.packing`` checks the model does).
* ``packing=False``: one example per row, right-padded, with an ``attention_mask``.

An example longer than ``block_size`` is truncated to its first ``block_size`` tokens or dropped
(``too_long``); one left with no trained token is dropped. Each row counts the examples it holds,
how many of them were truncated, and the examples dropped since the previous row (the columns
``examples``, ``truncated``, ``dropped``; ``sparkdp.spark.text.example_counts`` sums them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError, DataError

IGNORE_INDEX = -100
TOO_LONG = ("truncate", "drop")
COUNT_COLUMNS = ("examples", "truncated", "dropped")
PACKED_COLUMNS = ("input_ids", "labels", "position_ids")
PADDED_COLUMNS = ("input_ids", "labels", "attention_mask")

Segments = Sequence[tuple[str, bool]]  # (text, trained)


def check_too_long(value: object) -> str:
    if value not in TOO_LONG:
        raise ConfigError(
            f"too_long must be one of {', '.join(map(repr, TOO_LONG))} (what to do with an example "
            f"longer than block_size); got {value!r}."
        )
    return str(value)


def encode_segments(tokenizer: Any, segments: Segments) -> tuple[list[int], list[int]]:
    """An example's ids and labels: each segment encoded on its own (no special tokens added),
    labels -100 on the untrained ones and on the first token."""
    ids: list[int] = []
    labels: list[int] = []
    texts = [text for text, _ in segments]
    for enc, (_, trained) in zip(
        tokenizer.encode_batch(texts, add_special_tokens=False), segments, strict=True
    ):
        ids.extend(enc.ids)
        labels.extend(enc.ids if trained else [IGNORE_INDEX] * len(enc.ids))
    if labels:
        labels[0] = IGNORE_INDEX
    return ids, labels


def chat_segments(renderer: Any, messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """A conversation rendered by ``renderer`` (a transformers fast tokenizer holding the chat
    template) as segments: each assistant turn trained, everything else (system, user, the
    template's markup and generation prompt) not. The template is rendered on growing prefixes
    of the conversation, so each rendering must begin with the one before."""

    def render(upto: int, generation_prompt: bool) -> str:
        if upto == 0 and not generation_prompt:
            return ""
        return str(
            renderer.apply_chat_template(
                list(messages[:upto]), tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    segments: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt, whole = render(i, True), render(i + 1, False)
        if not prompt.startswith(done) or not whole.startswith(prompt):
            raise DataError(
                "the chat template renders a conversation's first turns differently once more "
                "follow, so the assistant turns cannot be told apart from the prompt; use a "
                "template whose rendering of the first k messages begins every longer rendering."
            )
        segments += [(prompt[len(done) :], False), (whole[len(prompt) :], True)]
        done = whole
    rest = render(len(messages), False)
    if rest.startswith(done) and len(rest) > len(done):
        segments.append((rest[len(done) :], False))
    return [s for s in segments if s[0]]


class ExamplePacker:
    """Examples (ids, labels) into rows of ``block_size`` tokens (see the module docstring)."""

    def __init__(self, block_size: int, pad_id: int, packing: bool, too_long: str) -> None:
        self.block_size, self.pad_id, self.packing = block_size, pad_id, packing
        self.too_long = check_too_long(too_long)
        self._open: list[tuple[list[int], list[int], bool]] = []  # the row being filled
        self._used = 0
        self._dropped = 0  # since the last row
        self._rows: list[tuple[list[tuple[list[int], list[int], bool]], int]] = []

    def add(self, examples: Iterable[tuple[list[int], list[int]]]) -> pa.RecordBatch | None:
        """Take these examples; the rows they completed, or None."""
        for ids, labels in examples:
            truncated = len(ids) > self.block_size
            if truncated and self.too_long == "drop":
                self._dropped += 1
                continue
            ids, labels = ids[: self.block_size], labels[: self.block_size]
            if all(label == IGNORE_INDEX for label in labels):
                self._dropped += 1  # nothing left to train on
                continue
            if not self.packing or self._used + len(ids) > self.block_size:
                self._close()
            self._open.append((ids, labels, truncated))
            self._used += len(ids)
        ready, self._rows = self._rows, []
        return self._batch(ready)

    def finish(self) -> pa.RecordBatch | None:
        """The last, partly filled row, which counts the examples dropped since the row before
        (after the first kept example a row is always open; with none kept there is no row to
        count the drops on: :attr:`unreported` holds them)."""
        self._close()
        ready, self._rows = self._rows, []
        return self._batch(ready)

    def skip(self, count: int) -> None:
        """Count ``count`` examples dropped before tokenizing (a null prompt, completion or
        conversation)."""
        self._dropped += count

    @property
    def unreported(self) -> int:
        """Examples dropped that no row counts (none was kept)."""
        return self._dropped

    def _close(self) -> None:
        if self._open:
            self._rows.append((self._open, self._dropped))
            self._open, self._used, self._dropped = [], 0, 0

    def _batch(
        self, rows: list[tuple[list[tuple[list[int], list[int], bool]], int]]
    ) -> pa.RecordBatch | None:
        return rows_batch(rows, self.block_size, self.pad_id, self.packing) if rows else None


def rows_batch(
    rows: Sequence[tuple[Sequence[tuple[list[int], list[int], bool]], int]],
    block_size: int,
    pad_id: int,
    packing: bool,
) -> pa.RecordBatch:
    """Rows of examples (and the drops before each) as a record batch: the token columns as
    ``list<int64>`` of ``block_size``, the counts as int64."""
    n = len(rows)
    ids = np.full((n, block_size), pad_id, dtype=np.int64)
    labels = np.full((n, block_size), IGNORE_INDEX, dtype=np.int64)
    third = np.zeros((n, block_size), dtype=np.int64)  # position_ids, or the attention mask
    counts = np.zeros((n, 3), dtype=np.int64)
    for r, (examples, dropped) in enumerate(rows):
        at = 0
        for example_ids, example_labels, _ in examples:
            end = at + len(example_ids)
            ids[r, at:end], labels[r, at:end] = example_ids, example_labels
            third[r, at:end] = np.arange(len(example_ids)) if packing else 1
            at = end
        if packing:  # the padding: a sequence of its own, trained on nothing
            third[r, at:] = np.arange(block_size - at)
        counts[r] = (len(examples), sum(t for _, _, t in examples), dropped)
    offsets = pa.array(np.arange(0, (n + 1) * block_size, block_size), type=pa.int32())

    def column(values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), type=pa.int64()))

    names = list(PACKED_COLUMNS if packing else PADDED_COLUMNS) + list(COUNT_COLUMNS)
    arrays = [column(ids), column(labels), column(third)] + [pa.array(counts[:, i]) for i in range(3)]
    return pa.RecordBatch.from_arrays(arrays, names=names)


__all__ = [
    "COUNT_COLUMNS",
    "PACKED_COLUMNS",
    "PADDED_COLUMNS",
    "TOO_LONG",
    "ExamplePacker",
    "chat_segments",
    "check_too_long",
    "encode_segments",
    "rows_batch",
]
