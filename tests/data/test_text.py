"""Tokenizers as JSON, documents packed into blocks, and the built-in fortunes corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from sparkdp.data.text import (
    BlockPacker,
    PackCounts,
    concat_documents,
    encode_texts,
    eos_id_of,
    pack_counted,
    pack_documents,
    tokenizer_json,
    train_bpe_tokenizer,
)
from sparkdp.data.text_datasets import (
    FORTUNES_DIR,
    TEXT_DATASETS,
    build_text_dataset,
    read_fortunes,
    split_documents,
)
from sparkdp.errors import ConfigError, DataError


def word_tokenizer() -> Tokenizer:
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "[UNK]": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def test_packing_a_small_text_by_hand():
    ids = encode_texts(word_tokenizer(), ["a b", "c", "b b c a"])
    assert ids == [[1, 2], [3], [2, 2, 3, 1]]
    # stream: 1 2 0 | 3 0 | 2 2 3 1 0  ->  blocks of 4: [1 2 0 3] [0 2 2 3], tail [1 0] dropped
    np.testing.assert_array_equal(pack_documents(ids, 4, eos_id=0), [[1, 2, 0, 3], [0, 2, 2, 3]])
    assert pack_documents(ids, 11, eos_id=0).shape == (0, 11)
    np.testing.assert_array_equal(concat_documents([], 0), np.empty(0))


def test_packing_counts_skipped_and_truncated_documents_by_hand():
    ids = [[1, 2], [], [3], [2, 2, 3, 1]]
    # stream: 1 2 0 | 3 0 | 2 2 3 1 0 (the empty document skipped, no lone separator)  ->
    # blocks [1 2 0 3] [0 2 2 3]; the tail [1 0] cuts the last document
    blocks, counts = pack_counted(ids, 4, eos_id=0)
    np.testing.assert_array_equal(blocks, [[1, 2, 0, 3], [0, 2, 2, 3]])
    assert counts == PackCounts(documents=3, skipped=1, truncated=1, dropped_tokens=2, blocks=2)
    # stream 1 2 3 0 3 | 0 4 0: the tail cuts [3] (its separator) and drops [4] whole
    _, counts = pack_counted([[1, 2, 3], [3], [4]], 5, eos_id=0)
    assert (counts.blocks, counts.truncated, counts.dropped_tokens) == (1, 2, 3)
    assert "1 blocks from 3 documents; 0 null or empty skipped, 2 truncated" in counts.describe()


def test_the_packer_carries_its_tail_into_the_next_call():
    packer = BlockPacker(3, eos_id=9)
    np.testing.assert_array_equal(packer.add([[1, 2, 3, 4]]), [[1, 2, 3]])  # 1 2 3 | 4 9
    np.testing.assert_array_equal(packer.tail, [4, 9])
    np.testing.assert_array_equal(packer.add([[5], [6, 7]]), [[4, 9, 5], [9, 6, 7]])
    np.testing.assert_array_equal(packer.tail, [9])
    with pytest.raises(ConfigError, match="block_size must be a positive integer"):
        BlockPacker(0, 1)


def test_tokenizer_json_from_an_object_or_a_file(tmp_path):
    tok = word_tokenizer()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    for given in (tok, path, str(path), tmp_path):
        text = tokenizer_json(given)
        assert json.loads(text)["model"]["type"] == "WordLevel"
        assert Tokenizer.from_str(text).encode("b c").ids == [2, 3]
    with pytest.raises(ConfigError, match="does not exist"):
        tokenizer_json(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="must be a tokenizers.Tokenizer"):
        tokenizer_json(42)


def test_eos_lookup():
    tok = word_tokenizer()
    assert eos_id_of(tok) == 0
    assert eos_id_of(tok, "c") == 3
    with pytest.raises(ConfigError, match="no token 'zz'"):
        eos_id_of(tok, "zz")
    bare = Tokenizer(models.WordLevel({"x": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(ConfigError, match="eos_token="):
        eos_id_of(bare)


def test_bpe_training_is_deterministic_and_round_trips():
    texts = ["the cat sat on the mat", "the dog sat on the log", "cats and dogs"] * 20
    a, b = train_bpe_tokenizer(texts, 300), train_bpe_tokenizer(texts, 300)
    assert a.to_str() == b.to_str()
    assert a.token_to_id("<|endoftext|>") == 0
    assert a.decode(a.encode("the cat sat, naïvely").ids) == "the cat sat, naïvely"  # byte-level: no unknowns


def test_text_dataset_splits_tokenizes_and_packs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    docs = [f"document {i}: the quick brown fox jumps over the lazy dog" for i in range(40)]
    ds = build_text_dataset("demo", docs, vocab_size=300, block_size=16)
    train, validation = split_documents(docs)
    assert (ds.train_texts, ds.validation_texts) == (train, validation)
    assert validation == (docs[19], docs[39]) and len(train) == 38
    # against tokenizer.encode directly, document by document
    tok = ds.tokenizer
    stream = [i for d in train for i in [*tok.encode(d).ids, ds.eos_id]]
    whole = len(stream) // 16 * 16
    np.testing.assert_array_equal(ds.train_blocks, np.array(stream[:whole]).reshape(-1, 16))
    assert ds.train_blocks.dtype == np.int64 and ds.vocab_size <= 300
    cached = list((tmp_path / "tokenizers").iterdir())
    assert len(cached) == 1 and cached[0].read_text() == ds.tokenizer_json
    again = build_text_dataset("demo", docs, vocab_size=300, block_size=16)  # read from the cache
    assert again.tokenizer_json == ds.tokenizer_json


def test_fortune_files_are_read_as_cookies(tmp_path):
    (tmp_path / "wisdom").write_text("First cookie,\ntwo lines.\n%\nSecond.\n\t\t-- Someone\n%\n")
    (tmp_path / "wisdom.dat").write_bytes(b"\0\0\0\2binary index")
    (tmp_path / "wisdom.u8").symlink_to(tmp_path / "wisdom")
    (tmp_path / "art").write_text("Third\n")
    assert read_fortunes(tmp_path) == ["Third", "First cookie,\ntwo lines.", "Second.\n\t\t-- Someone"]
    with pytest.raises(DataError, match="apt-get install -y fortunes"):
        read_fortunes(tmp_path / "nowhere")


@pytest.mark.skipif(not FORTUNES_DIR.is_dir(), reason="the Debian package `fortunes` is not installed")
def test_the_installed_fortunes_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    docs = read_fortunes(FORTUNES_DIR)
    assert len(docs) > 15_000
    ds = TEXT_DATASETS.create("fortunes", limit=400, vocab_size=512, block_size=64)
    assert len(ds.train_texts) == 380 and len(ds.validation_texts) == 20
    assert ds.train_blocks.shape[1] == 64 and len(ds.train_blocks) > 50 and len(ds.validation_blocks) > 0
    assert ds.train_blocks.max() < ds.vocab_size <= 512
