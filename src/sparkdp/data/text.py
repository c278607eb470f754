"""Text for language models: tokenizers that travel as JSON, and documents packed into blocks.

Packing concatenates the documents' token ids, each followed by the end-of-text token, and
cuts the stream into blocks of ``block_size`` tokens. ``labels`` equal ``input_ids``: the model
shifts them inside (position t predicts token t + 1), as Hugging Face causal language models
and :mod:`sparkdp.models.gpt` do. The tokens after the last whole block of a stream (fewer than
``block_size``) are dropped, so a stream loses at most ``block_size - 1`` tokens.

Tokenizers are Hugging Face ``tokenizers`` objects (the ``text`` extra). They move between
processes as their JSON serialisation, never pickled.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import ConfigError

log = logging.getLogger(__name__)

#: the end-of-text token of the tokenizers sparkdp trains, also looked for in others
EOS_TOKEN = "<|endoftext|>"
#: the columns of packed blocks
BLOCK_COLUMNS = ("input_ids", "labels")
#: end-of-document tokens looked up, in order, when none is named
EOS_CANDIDATES = (EOS_TOKEN, "</s>", "<eos>", "[SEP]", "<|end_of_text|>")


def require_tokenizers() -> Any:
    try:
        import tokenizers  # type: ignore[import-untyped, unused-ignore]
    except ImportError as err:  # an optional dependency
        raise ConfigError(
            "text data needs the Hugging Face `tokenizers` package: "
            "pip install 'sparkdp[text]' (or pip install tokenizers)."
        ) from err
    return tokenizers


def tokenizer_json(tokenizer: Any) -> str:
    """A tokenizer's JSON serialisation, from a ``tokenizers.Tokenizer``, a Hugging Face fast
    tokenizer (its ``backend_tokenizer``) or the path of a ``tokenizer.json`` file."""
    tk = require_tokenizers()
    if isinstance(tokenizer, (str, Path)):
        path = Path(tokenizer)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(
                f"tokenizer file {str(path)!r} does not exist; give the path of a tokenizer.json "
                f"(a Hugging Face `tokenizers` serialisation) or a tokenizers.Tokenizer."
            )
        text = path.read_text(encoding="utf-8")
        tk.Tokenizer.from_str(text)  # fail here, on the driver, not in every task
        return text
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # transformers' fast tokenizers wrap one
    if isinstance(backend, tk.Tokenizer):
        return backend.to_str()
    raise ConfigError(
        f"tokenizer must be a tokenizers.Tokenizer, a Hugging Face fast tokenizer or the path of a "
        f"tokenizer.json; got {type(tokenizer).__name__}."
    )


def eos_id_of(tokenizer: Any, eos_token: str | None = None) -> int:
    """The id of ``eos_token``, or of the first of :data:`EOS_CANDIDATES` the vocabulary has."""
    wanted = (eos_token,) if eos_token is not None else EOS_CANDIDATES
    for token in wanted:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    if eos_token is not None:
        raise ConfigError(
            f"the tokenizer has no token {eos_token!r}; name one of its tokens as eos_token "
            f"(it separates the documents in packed blocks)."
        )
    raise ConfigError(
        f"the tokenizer has none of the usual end-of-text tokens ({', '.join(EOS_CANDIDATES)}); "
        f"name the token that separates documents with eos_token=."
    )


def check_block_size(block_size: object) -> int:
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ConfigError(f"block_size must be a positive integer (tokens per block); got {block_size!r}.")
    return block_size


def concat_documents(ids: Sequence[Sequence[int]], eos_id: int) -> np.ndarray:
    """The documents' ids end to end, ``eos_id`` after each, as one int64 array."""
    total = sum(len(doc) for doc in ids) + len(ids)
    eos = (eos_id,)
    # chain/fromiter walk the ids inside C; no Python code runs per token
    return np.fromiter(
        itertools.chain.from_iterable(itertools.chain(doc, eos) for doc in ids), dtype=np.int64, count=total
    )


@dataclass
class PackCounts:
    """What packing did with the documents it was given.

    Attributes:
        documents: documents packed, whole or in part.
        skipped: null or empty documents (no tokens), left out.
        truncated: documents with tokens in the dropped tail (fewer than a block's tokens at the
            end of the data, or of each Spark partition): cut short, or dropped whole.
        dropped_tokens: the tail's tokens, end-of-text tokens included.
        blocks: blocks made.
    """

    documents: int = 0
    skipped: int = 0
    truncated: int = 0
    dropped_tokens: int = 0
    blocks: int = 0

    def __add__(self, other: PackCounts) -> PackCounts:
        return PackCounts(*(getattr(self, name) + getattr(other, name) for name in self.__dataclass_fields__))

    def describe(self) -> str:
        return (
            f"{self.blocks:,} blocks from {self.documents:,} documents; {self.skipped:,} null or empty "
            f"skipped, {self.truncated:,} truncated at the end ({self.dropped_tokens:,} tokens dropped)"
        )


class BlockPacker:
    """Cuts a stream of documents' token ids into ``block_size`` blocks, carrying the tail
    from one call to the next; whatever is left at the end (``tail``) is dropped by the caller,
    and :meth:`finish` counts it. Documents without tokens are skipped, counted in ``counts``."""

    def __init__(self, block_size: int, eos_id: int) -> None:
        self.block_size = check_block_size(block_size)
        self.eos_id = eos_id
        self.tail = np.empty(0, dtype=np.int64)
        self.counts = PackCounts()

    def add(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """The whole blocks the tail and these documents make, shape (n, block_size)."""
        kept = [doc for doc in ids if len(doc)]  # (an empty document would add a lone separator)
        self.counts.skipped += len(ids) - len(kept)
        self.counts.documents += len(kept)
        stream = np.concatenate([self.tail, concat_documents(kept, self.eos_id)])
        whole = len(stream) // self.block_size * self.block_size
        self.tail = stream[whole:]
        self.counts.blocks += whole // self.block_size
        return stream[:whole].reshape(-1, self.block_size)

    def skip(self, documents: int) -> None:
        """Count documents left out before tokenizing (null texts)."""
        self.counts.skipped += documents

    def finish(self) -> PackCounts:
        """The counts, with the tail (dropped) counted: every document ends with a separator, so
        the separators in the tail are the documents it cuts."""
        self.counts.truncated = int(np.count_nonzero(self.tail == self.eos_id))
        self.counts.dropped_tokens = len(self.tail)
        return self.counts


def pack_documents(ids: Sequence[Sequence[int]], block_size: int, eos_id: int) -> np.ndarray:
    """Documents' token ids packed into blocks (shape (n, block_size)); the last partial block dropped."""
    return pack_counted(ids, block_size, eos_id)[0]


def pack_counted(ids: Sequence[Sequence[int]], block_size: int, eos_id: int) -> tuple[np.ndarray, PackCounts]:
    """:func:`pack_documents` and what it did: documents packed, skipped, truncated."""
    packer = BlockPacker(block_size, eos_id)
    blocks = packer.add(ids)
    return blocks, packer.finish()


def encode_texts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each text's ids, without the tokenizer's own special tokens (packing adds the separator)."""
    return [enc.ids for enc in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Any:
    """A byte-level BPE tokenizer (GPT-2's scheme) learnt from ``texts``, with :data:`EOS_TOKEN`
    as its one special token (id 0). The same texts in the same order give the same tokenizer."""
    tk = require_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tk.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def blocks_batch(blocks: np.ndarray) -> pa.RecordBatch:
    """(n, block_size) int64 ids as a record batch of ``input_ids`` and ``labels`` list<int64> columns
    (one array twice: the model shifts the labels)."""
    n, size = blocks.shape
    offsets = pa.array(np.arange(0, (n + 1) * size, size), type=pa.int32())
    ids = pa.ListArray.from_arrays(offsets, pa.array(blocks.reshape(-1), type=pa.int64()))
    return pa.RecordBatch.from_arrays([ids, ids], names=list(BLOCK_COLUMNS))


def write_blocks(blocks: np.ndarray, path: str | Path) -> Path:
    """Packed blocks as a Parquet file of ``input_ids`` and ``labels``, written atomically."""
    import pyarrow.parquet as pq

    from ..files import atomic_write

    table = pa.Table.from_batches([blocks_batch(blocks)])
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp))
