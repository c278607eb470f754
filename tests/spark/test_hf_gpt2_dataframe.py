"""A Hugging Face GPT-2 (built from a config, nothing downloaded) trained by ``fit`` on a Spark
DataFrame of token blocks from ``tokenize_blocks``, against a plain PyTorch loop on one process
with the same token budget (tests/helpers/gpt2_reference.py): the same initial weights, the same
optimizer steps of 2 workers x 4 blocks x accumulate 2 = 16 blocks, the same bf16 autocast; only
the order the blocks arrive in differs. The validation losses must agree within 5 %.

Two Spark stages per epoch and a transformers import in every task make it a slow test; its fast
sibling in tests/train/test_hf_gpt2_loop.py runs the same comparison through the worker loop in
this process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sparkdp
from sparkdp.data.text_datasets import FORTUNES_DIR
from sparkdp.spark.text import tokenize_blocks
from tests.helpers.gpt2_reference import BLOCK, LR, fortunes_slice, gpt2, single_process, validation_loss

pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not FORTUNES_DIR.is_dir(), reason="the Debian package `fortunes` is not installed"),
]

WORKERS, BATCH, ACCUMULATE, EPOCHS = 2, 4, 2, 2
ROWS = 128  # training blocks: 8 optimizer steps of 16 blocks per epoch


def test_gpt2_from_a_config_trains_on_a_dataframe_like_one_process(spark):
    corpus = fortunes_slice()
    texts = spark.createDataFrame([(d,) for d in corpus.train_texts], "text string").coalesce(1)
    # one partition packs in document order; its first ROWS blocks, dealt out to the two workers
    blocks_df = tokenize_blocks(texts, "text", corpus.tokenizer, block_size=BLOCK).limit(ROWS)
    blocks_df = blocks_df.repartition(WORKERS).cache()
    try:
        train_blocks = torch.tensor(np.array([r.input_ids for r in blocks_df.collect()]))
        assert train_blocks.shape == (ROWS, BLOCK)
        model = gpt2(corpus.tokenizer.get_vocab_size())
        reference = single_process(model, train_blocks, WORKERS * BATCH * ACCUMULATE, EPOCHS)
        initial = validation_loss(model, corpus.validation)

        result = sparkdp.fit(
            model,
            blocks_df,
            features=["input_ids", "labels"],
            dict_batches=True,
            loss="model",
            optimizer="adamw",
            optimizer_options={"lr": LR},
            precision="bf16-mixed",
            accumulate=ACCUMULATE,
            workers=WORKERS,
            batch_size=BATCH,
            epochs=EPOCHS,
            spark=spark,
            show_progress=False,
        )
    finally:
        blocks_df.unpersist()
    # every block trained once per epoch: the reference's steps of the same number of tokens
    assert [h["samples"] for h in result.history] == [ROWS] * EPOCHS

    got, expected = (
        validation_loss(result.model, corpus.validation),
        validation_loss(reference, corpus.validation),
    )
    assert expected < initial - 0.5  # the reference learned: not a comparison of two untrained models
    assert abs(got - expected) <= 0.05 * expected, (got, expected, initial)
