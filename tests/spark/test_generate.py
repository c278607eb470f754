"""sparkdp.generate on 2 Spark workers against Hugging Face's own generate on one process: greedy
completions equal row for row (prompts of different lengths, several per batch, two partitions),
sampling reproducible from the seed whatever the partitioning, and bad input as one line."""

from __future__ import annotations

import pytest

import sparkdp
from sparkdp.errors import ConfigError, DataError
from tests.helpers.tiny_lm import PROMPTS, hf_greedy, tiny_lm

pytest.importorskip("transformers")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return tiny_lm(tmp_path_factory.mktemp("tiny-gpt2"))


def _prompts_df(spark, partitions: int):
    rows = [(i, p) for i, p in enumerate(PROMPTS)] + [(len(PROMPTS), None)]
    return spark.createDataFrame(rows, "id long, prompt string").repartition(partitions)


def test_greedy_equals_hugging_face_generate_row_for_row(spark, lm):
    out = sparkdp.generate(lm.directory, _prompts_df(spark, 2), max_new_tokens=10, batch_size=4)
    got = {r.id: r.generated for r in out.collect()}
    expected = {i: hf_greedy(lm, p, 10) for i, p in enumerate(PROMPTS)}
    assert {i: got[i] for i in expected} == expected
    assert len(set(expected.values())) == len(PROMPTS), "the model continues each prompt its own way"
    assert got[len(PROMPTS)] is None, "a null prompt gives a null completion"


def test_in_memory_model_with_its_tokenizer_and_the_sampled_text_reproducible(spark, lm):
    def sampled(partitions: int, batch_size: int, seed: int) -> dict:
        out = sparkdp.generate(
            lm.model,
            _prompts_df(spark, partitions).where("prompt is not null"),
            tokenizer=lm.tokenizer,
            max_new_tokens=8,
            do_sample=True,
            temperature=1.5,
            seed=seed,
            batch_size=batch_size,
            output_col="text",
        )
        return {r.id: r.text for r in out.collect()}

    first = sampled(2, 4, seed=7)
    assert sampled(1, 1, seed=7) == first, "each row's draws do not depend on partitions or batches"
    assert sampled(2, 4, seed=8) != first, "another seed draws other text"
    greedy = {i: hf_greedy(lm, p, 8) for i, p in enumerate(PROMPTS)}
    assert first != greedy, "sampling at temperature 1.5 is not greedy decoding"
    top1 = sparkdp.generate(
        lm.model,
        _prompts_df(spark, 2).where("prompt is not null"),
        tokenizer=lm.tokenizer,
        max_new_tokens=8,
        do_sample=True,
        top_k=1,
    )
    assert {r.id: r.generated for r in top1.collect()} == greedy, "top_k=1 sampling is greedy"


def test_bad_input_is_one_clear_line(spark, lm, tmp_path):
    df = _prompts_df(spark, 1)
    with pytest.raises(ConfigError, match="has no column 'text'; its columns: id, prompt"):
        sparkdp.generate(lm.directory, df, prompt="text")
    with pytest.raises(ConfigError, match="prompt column 'id' holds bigint, not text"):
        sparkdp.generate(lm.directory, df, prompt="id")
    with pytest.raises(ConfigError, match="top_p must be a number in \\(0, 1\\]"):
        sparkdp.generate(lm.directory, df, do_sample=True, top_p=0.0)
    with pytest.raises(ConfigError, match="is not a Hugging Face model directory \\(no config.json\\)"):
        sparkdp.generate(tmp_path, df)
    with pytest.raises(ConfigError, match="an in-memory model needs its tokenizer"):
        sparkdp.generate(lm.model, df)
    # found on the executors: a prompt longer than the model's 64 positions
    long_df = spark.createDataFrame([("the cat " * 40,)], "prompt string")
    with pytest.raises(Exception) as caught:
        sparkdp.generate(lm.directory, long_df, max_new_tokens=4).collect()
    text = str(caught.value)
    assert f"{DataError.__module__}.DataError: a prompt of" in text
    assert "exceeds the model's 64 positions; lower max_new_tokens or shorten the prompts" in text
    assert len(text.strip().splitlines()) <= 6, text  # Python's short traceback, not the model's stack
