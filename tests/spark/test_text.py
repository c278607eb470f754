"""tokenize_blocks: text tokenized and packed on the executors, checked against tokenizer.encode."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from sparkdp.data.text import PackCounts, encode_texts, pack_documents, train_bpe_tokenizer
from sparkdp.data.text_datasets import FORTUNES_DIR, read_fortunes, split_documents
from sparkdp.errors import ConfigError
from sparkdp.models import build_model
from sparkdp.spark.text import count_blocks, tokenize_blocks

pytestmark = pytest.mark.timeout(180)


def word_tokenizer() -> Tokenizer:
    tok = Tokenizer(
        models.WordLevel({"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3, "[UNK]": 4}, unk_token="[UNK]")
    )
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def rows(df) -> tuple[np.ndarray, np.ndarray]:
    got = df.collect()
    return np.array([r.input_ids for r in got]), np.array([r.labels for r in got])


def test_a_small_text_packed_by_hand(spark, tmp_path):
    df = spark.createDataFrame([("a b",), (None,), ("c",), ("b b c a",)], "text string").coalesce(1)
    path = tmp_path / "tokenizer.json"
    word_tokenizer().save(str(path))
    blocks = tokenize_blocks(df, "text", str(path), block_size=4)
    assert blocks.schema.simpleString() == "struct<input_ids:array<bigint>,labels:array<bigint>>"
    ids, labels = rows(blocks)
    # 1 2 <eos> | 3 <eos> | 2 2 3 1 <eos>  (the null row skipped): two whole blocks, [1 0] dropped
    np.testing.assert_array_equal(ids, [[1, 2, 0, 3], [0, 2, 2, 3]])
    np.testing.assert_array_equal(labels, ids)  # the model shifts the labels itself


def test_skipped_and_truncated_documents_are_counted(spark, tmp_path, caplog):
    rows_ = [("a b",), (None,), ("",), ("c",), ("b b c a",)]
    df = spark.createDataFrame(rows_, "text string").coalesce(1)
    path = tmp_path / "tokenizer.json"
    word_tokenizer().save(str(path))
    with caplog.at_level(logging.INFO, logger="sparkdp"):
        counts = count_blocks(df, "text", str(path), block_size=4)
    # as packed by hand above: 1 2 <eos> | 3 <eos> | 2 2 3 1 <eos>, the null and the empty text
    # skipped, two blocks, the tail [1 <eos>] cutting the last document
    assert counts == PackCounts(documents=3, skipped=2, truncated=1, dropped_tokens=2, blocks=2)
    assert len(rows(tokenize_blocks(df, "text", str(path), block_size=4))[0]) == counts.blocks
    assert "2 blocks from 3 documents; 2 null or empty skipped, 1 truncated" in caplog.text


def test_partitions_pack_separately_and_match_tokenizer_encode(spark):
    texts = [f"line {i}: {'spark ' * (i % 7)}tokenizes text on executors" for i in range(60)]
    tok = train_bpe_tokenizer(texts, 300)
    # spark.range's partitions are contiguous id ranges: documents 0-19, 20-39, 40-59
    df = spark.range(0, 60, numPartitions=3).selectExpr(
        "concat('line ', id, ': ', repeat('spark ', id % 7), 'tokenizes text on executors') AS doc"
    )
    expected = []
    for part in (
        texts[0:20],
        texts[20:40],
        texts[40:60],
    ):  # encode each document, pack each partition by hand
        stream = [i for t in part for i in [*tok.encode(t).ids, 0]]
        expected += [stream[k : k + 32] for k in range(0, len(stream) - 31, 32)]
    ids, _ = rows(tokenize_blocks(df, "doc", tok, block_size=32))
    assert sorted(map(tuple, ids.tolist())) == sorted(map(tuple, expected))
    assert len(ids) > 5


def test_bad_input_is_explained(spark):
    df = spark.createDataFrame([(1, "a")], "n int, text string")
    with pytest.raises(ConfigError, match="no column 'body'.*n, text"):
        tokenize_blocks(df, "body", word_tokenizer(), 4)
    with pytest.raises(ConfigError, match="holds int, not text"):
        tokenize_blocks(df, "n", word_tokenizer(), 4)
    with pytest.raises(ConfigError, match="block_size must be a positive integer"):
        tokenize_blocks(df, "text", word_tokenizer(), 0)


@pytest.mark.skipif(not FORTUNES_DIR.is_dir(), reason="the Debian package `fortunes` is not installed")
def test_blocks_from_the_fortunes_corpus_train_a_tiny_gpt(spark):
    train, _ = split_documents(read_fortunes(FORTUNES_DIR)[:400])
    tok = train_bpe_tokenizer(train, 256)
    df = spark.createDataFrame([(d,) for d in train], "text string").coalesce(1)
    got = tokenize_blocks(df, "text", tok, block_size=32).collect()
    ids = torch.tensor([r.input_ids for r in got])
    labels = torch.tensor([r.labels for r in got])
    assert ids.shape[1] == 32 and len(ids) > 100 and ids.max() < tok.get_vocab_size()
    # the same blocks as packing the corpus by hand on the driver
    eos = tok.token_to_id("<|endoftext|>")
    np.testing.assert_array_equal(ids.numpy(), pack_documents(encode_texts(tok, train), 32, eos))
    torch.manual_seed(0)
    model = build_model("gpt-tiny", block_size=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(40):  # a plain torch loop over batches of 16 blocks
        rows = slice(step * 16 % (len(ids) - 16), step * 16 % (len(ids) - 16) + 16)
        loss = model(input_ids=ids[rows], labels=labels[rows]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0  # from ln(256) = 5.5 towards the text's entropy
