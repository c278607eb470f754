"""Built-in text corpora for language models, read from where the machine keeps them.

``fortunes``: the fortune-cookie databases of BSD ``fortune(6)`` as Debian's ``fortunes``
package installs them (``/usr/share/games/fortunes``, 15,217 quotations and jokes in 2.6 MB
of UTF-8 text; the package's copyright file puts it under the BSD licence, the quotations
gathered from many sources). Each cookie is one document. Every 20th document (by file
name, then position) is the validation split; the rest train.

A byte-level BPE tokenizer is trained on the training split only and cached as
``tokenizer.json`` under the cache directory (``SPARKDP_CACHE``, else
``$XDG_CACHE_HOME/sparkdp``, else ``~/.cache/sparkdp``), keyed by a hash of the corpus and
the vocabulary size, so every run of every worker sees the same ids.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..files import atomic_write, cache_dir
from ..registry import Registry
from .text import EOS_TOKEN, PackCounts, encode_texts, pack_counted, require_tokenizers, train_bpe_tokenizer

FORTUNES_DIR = Path("/usr/share/games/fortunes")
VALIDATION_EVERY = 20  # every 20th document is held out: 5 %, from every file


@dataclass(frozen=True)
class TextDataset:
    """A corpus split into training and validation documents, its tokenizer, and both splits
    packed into ``block_size``-token blocks (int64; ``labels`` are the same ids, shifted by the model)."""

    name: str
    train_texts: tuple[str, ...]
    validation_texts: tuple[str, ...]
    tokenizer_json: str
    block_size: int
    train_blocks: np.ndarray
    validation_blocks: np.ndarray
    #: what packing did with each split's documents ("train", "validation")
    counts: dict[str, PackCounts] | None = None

    @property
    def tokenizer(self) -> Any:
        return require_tokenizers().Tokenizer.from_str(self.tokenizer_json)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.token_to_id(EOS_TOKEN))


log = logging.getLogger(__name__)

TEXT_DATASETS: Registry[TextDataset] = Registry("text dataset")


def read_fortunes(root: Path) -> list[str]:
    """Every cookie of the fortune files in ``root`` (``%`` lines separate them), in file-name order."""
    if not root.is_dir():
        raise DataError(
            f"fortune directory {str(root)!r} does not exist. Install the Debian package `fortunes` "
            f"(`apt-get install -y fortunes`, which `make setup` does when run as root) or set SPARKDP_FORTUNES "
            f"to a directory of fortune files."
        )
    # the .dat files are fortune's binary indexes; the .u8 names are links to the text files
    files = sorted(
        p for p in root.iterdir() if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8")
    )
    docs: list[str] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.extend(d.strip("\n") for d in text.split("\n%\n"))
    docs = [d for d in docs if d.strip() and d.strip() != "%"]
    if not docs:
        raise DataError(
            f"no fortunes found in {str(root)!r} (expected text files of cookies separated by % lines)."
        )
    return docs


def split_documents(docs: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, validation): every :data:`VALIDATION_EVERY`-th document is validation."""
    return (
        tuple(d for i, d in enumerate(docs) if i % VALIDATION_EVERY != VALIDATION_EVERY - 1),
        tuple(d for i, d in enumerate(docs) if i % VALIDATION_EVERY == VALIDATION_EVERY - 1),
    )


def cached_tokenizer(name: str, train_texts: tuple[str, ...], vocab_size: int) -> str:
    """The JSON of the BPE tokenizer trained on ``train_texts``, trained once and cached."""
    digest = hashlib.sha256()
    for text in train_texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    digest.update(f"bpe:{vocab_size}:{require_tokenizers().__version__}".encode())
    path = cache_dir() / "tokenizers" / f"{name}-{vocab_size}-{digest.hexdigest()[:16]}.json"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    text = train_bpe_tokenizer(train_texts, vocab_size).to_str()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return text


def build_text_dataset(
    name: str, docs: list[str], *, vocab_size: int, block_size: int, limit: int | None = None
) -> TextDataset:
    """Split ``docs`` (the first ``limit`` when given), train or reuse the tokenizer, pack both splits."""
    if limit is not None:
        docs = docs[:limit]
    train, validation = split_documents(docs)
    tok_json = cached_tokenizer(name, train, vocab_size)
    tokenizer = require_tokenizers().Tokenizer.from_str(tok_json)
    eos = int(tokenizer.token_to_id(EOS_TOKEN))

    packed = {
        split: pack_counted(encode_texts(tokenizer, texts), block_size, eos)
        for split, texts in (("train", train), ("validation", validation))
    }
    for split, (_, counts) in packed.items():
        log.info("%s %s: %s", name, split, counts.describe())
    return TextDataset(
        name,
        train,
        validation,
        tok_json,
        block_size,
        packed["train"][0],
        packed["validation"][0],
        {split: counts for split, (_, counts) in packed.items()},
    )


@TEXT_DATASETS(
    "fortunes", description="BSD fortune cookies (Debian `fortunes`), 15k documents, 2.6 MB of text"
)
def fortunes(limit: int | None = None, vocab_size: int = 8192, block_size: int = 256) -> TextDataset:
    root = Path(os.environ.get("SPARKDP_FORTUNES", FORTUNES_DIR))
    return build_text_dataset(
        "fortunes", read_fortunes(root), vocab_size=vocab_size, block_size=block_size, limit=limit
    )


def load_text_dataset(name: str, **kwargs: Any) -> TextDataset:
    return TEXT_DATASETS.create(name, **kwargs)
