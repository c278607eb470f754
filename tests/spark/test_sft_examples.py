"""tokenize_examples on the executors: prompt/completion pairs and conversations into masked,
packed rows, equal to what sparkdp.data.sft builds in this process, with the counts."""

from __future__ import annotations

import pytest

from sparkdp.data.sft import ExamplePacker, encode_segments
from sparkdp.errors import ConfigError
from sparkdp.spark.text import example_counts, tokenize_examples
from tests.data.test_sft import TEMPLATE, word_tokenizer

pytest.importorskip("transformers")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

PAIRS = [("a b", "c"), ("a", "d e f g h a b c d"), (None, "c"), ("b c", "d e")]


def test_pairs_become_the_same_rows_as_in_one_process_with_their_counts(spark):
    df = spark.createDataFrame(PAIRS, "prompt string, completion string").coalesce(1)
    rows = tokenize_examples(
        df, prompt="prompt", completion="completion", tokenizer=word_tokenizer(), block_size=8
    )
    got = [r.asDict() for r in rows.collect()]

    tok = word_tokenizer()
    packer = ExamplePacker(8, 0, True, "truncate")
    examples = [encode_segments(tok, [(p, False), (c + "<|endoftext|>", True)]) for p, c in PAIRS if p]
    packer.skip(1)  # the null prompt
    want = [packer.add(examples), packer.finish()]
    want_rows = [
        dict(zip(b.schema.names, r)) for b in want if b is not None for r in zip(*b.to_pydict().values())
    ]
    assert got == want_rows
    assert got[0]["labels"][:4] == [-100, -100, 3, 0]  # "a b" masked, "c" and the end-of-text trained
    assert example_counts(rows) == {"rows": 3, "examples": 3, "truncated": 1, "dropped": 1}
    dropped = tokenize_examples(
        df, prompt="prompt", completion="completion", tokenizer=tok, block_size=8, too_long="drop"
    )
    assert example_counts(dropped) == {"rows": 2, "examples": 2, "truncated": 0, "dropped": 2}


def test_conversations_go_through_the_chat_template(spark):
    messages = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]]
    df = spark.createDataFrame([(m,) for m in messages], "messages array<struct<role:string,content:string>>")
    tok = word_tokenizer()
    tok.add_special_tokens(["<|user|>", "<|assistant|>", "<|end|>"])
    rows = tokenize_examples(df, messages="messages", tokenizer=tok, chat_template=TEMPLATE, block_size=12)
    (row,) = rows.collect()
    user, assistant, end = (tok.token_to_id(t) for t in ("<|user|>", "<|assistant|>", "<|end|>"))
    assert row.input_ids[:7] == [user, 1, end, assistant, 2, end, 0]
    assert row.labels[:7] == [-100, -100, -100, -100, 2, end, -100]  # the assistant's turn only
    with pytest.raises(ConfigError, match="messages need a chat template"):
        tokenize_examples(df, messages="messages", tokenizer=tok, block_size=12)
    with pytest.raises(ConfigError, match="give one of the two"):
        tokenize_examples(df, prompt="messages", tokenizer=tok, block_size=12)
