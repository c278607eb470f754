"""Fine-tuning examples (sparkdp.data.sft): labels, packing, truncation, chat templates, and
whether packed examples stay apart in a Hugging Face GPT-2 (sparkdp.train.packing)."""

from __future__ import annotations

import pytest
import torch

from sparkdp.data.arrow import ArrowConverter
from sparkdp.data.sft import ExamplePacker, chat_segments, encode_segments
from sparkdp.errors import ConfigError, DataError
from sparkdp.train.packing import check_packing

tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.timeout(120)

WORDS = ["<|endoftext|>", "a", "b", "c", "d", "e", "f", "g", "h"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer():
    """One id per word, in WORDS' order: ids a test can work out by hand."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="h"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def test_labels_are_minus_100_exactly_on_the_prompt_tokens():
    ids, labels = encode_segments(word_tokenizer(), [("a b c", False), (" d e<|endoftext|>", True)])
    assert ids == [1, 2, 3, 4, 5, 0]
    assert labels == [-100, -100, -100, 4, 5, 0]
    # the first token is never a target, even when trained: in a packed row it follows another example
    assert encode_segments(word_tokenizer(), [("d e", True)]) == ([4, 5], [-100, 5])


def _example(n: int, first: int = 1) -> tuple[list[int], list[int]]:
    ids = [first + i for i in range(n)]
    return ids, [-100] + ids[1:]


def test_packed_rows_restart_positions_per_example_and_count_what_they_hold():
    packer = ExamplePacker(8, pad_id=0, packing=True, too_long="truncate")
    assert packer.add([_example(3), _example(4, 10), _example(2, 20)]) is not None  # row 0 is full
    rows = packer.finish().to_pydict()
    assert rows["input_ids"] == [[20, 21, 0, 0, 0, 0, 0, 0]]
    assert rows["position_ids"] == [[0, 1, 0, 1, 2, 3, 4, 5]]  # the padding is a sequence of its own
    assert rows["labels"] == [[-100, 21, -100, -100, -100, -100, -100, -100]]
    first = ExamplePacker(8, 0, True, "truncate").add([_example(3), _example(4, 10), _example(2, 20)])
    assert first.to_pydict()["position_ids"] == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert first.to_pydict()["input_ids"] == [[1, 2, 3, 10, 11, 12, 13, 0]]
    assert first.to_pydict()["examples"] == [2]


def test_over_long_examples_are_truncated_or_dropped_and_counted():
    examples = [_example(3), _example(10, 30), _example(2, 20), ([5, 6, 7], [-100] * 3)]
    truncated = ExamplePacker(8, 0, True, "truncate")
    rows = [b.to_pydict() for b in (truncated.add(examples), truncated.finish()) if b is not None]
    got = {k: sum(sum(r[k]) for r in rows) for k in ("examples", "truncated", "dropped")}
    assert got == {"examples": 3, "truncated": 1, "dropped": 1}  # the last has nothing to train on
    assert [30, 31, 32, 33, 34, 35, 36, 37] in [ids for r in rows for ids in r["input_ids"]]
    dropping = ExamplePacker(8, 0, True, "drop")
    rows = [b.to_pydict() for b in (dropping.add(examples), dropping.finish()) if b is not None]
    got = {k: sum(sum(r[k]) for r in rows) for k in ("examples", "truncated", "dropped")}
    assert got == {"examples": 2, "truncated": 0, "dropped": 2}
    with pytest.raises(ConfigError, match="too_long must be one of 'truncate', 'drop'"):
        ExamplePacker(8, 0, True, "cut")


def test_padded_rows_hold_one_example_each_with_an_attention_mask():
    packer = ExamplePacker(4, 0, packing=False, too_long="truncate")
    packer.add([_example(3), _example(2, 20)])
    rows = packer.finish()
    assert rows is not None  # the second row; the first came from add
    assert rows.to_pydict()["attention_mask"] == [[1, 1, 0, 0]]


def _renderer(template: str = TEMPLATE):
    transformers = pytest.importorskip("transformers")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer())
    tok.chat_template = template
    return tok


def test_a_conversation_through_its_chat_template_trains_the_assistant_turns_only():
    messages = [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
        {"role": "assistant", "content": "e"},
    ]
    assert chat_segments(_renderer(), messages) == [
        ("<|system|>a<|end|><|user|>b<|end|><|assistant|>", False),
        ("c<|end|>", True),
        ("<|user|>d<|end|><|assistant|>", False),
        ("e<|end|>", True),
    ]
    unstable = "{{ messages | length }}{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(DataError, match="renders a conversation's first turns differently"):
        chat_segments(_renderer(unstable), messages)


def test_packed_columns_reach_the_model_as_a_dict_of_int64_tensors():
    packer = ExamplePacker(8, 0, True, "truncate")
    batch = packer.add([_example(3), _example(4, 10), _example(2, 20)])
    conv = ArrowConverter(batch.schema, ["input_ids", "labels", "position_ids"], dict_batches=True)
    x, y = conv.pack(conv.convert(batch))
    assert y is None and x["position_ids"].dtype == torch.int64
    assert x["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]


def _gpt2(attn: str = "sdpa", use_cache: bool = False):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, use_cache=use_cache
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_in_a_packed_row_the_second_example_sees_only_itself(attn):
    model = _gpt2(attn)
    packer = ExamplePacker(16, 0, True, "truncate")
    packer.add([_example(5, 1), _example(7, 30)])
    row = {k: torch.tensor(v) for k, v in packer.finish().to_pydict().items()}
    with torch.no_grad():
        packed = model(input_ids=row["input_ids"], position_ids=row["position_ids"]).logits[0, 5:12]
        alone = model(input_ids=torch.tensor([list(range(30, 37))])).logits[0]
        unmasked = model(input_ids=row["input_ids"]).logits[0, 5:12]  # the positions (the mask) removed
    assert (packed - alone).abs().max().item() < 1e-4
    assert (unmasked - alone).abs().max().item() > 1e-2  # the comparison can tell them apart
    check_packing(model, row)  # the driver's check lets it train


class _CumulativeLM(torch.nn.Module):
    """Takes position_ids but every token sees every earlier one, boundaries or not."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)

    def forward(self, input_ids, position_ids=None, labels=None):
        h = self.embed(input_ids).cumsum(1)
        return {"logits": h}


class _NoPositions(torch.nn.Module):
    def forward(self, input_ids, labels=None):
        return {"logits": input_ids.float()}


def test_packing_is_refused_for_a_model_that_lets_examples_attend_to_each_other():
    packer = ExamplePacker(16, 0, True, "truncate")
    packer.add([_example(5, 1), _example(7, 30)])
    row = {k: torch.tensor(v) for k, v in packer.finish().to_pydict().items()}
    with pytest.raises(ConfigError, match="lets packed examples attend to each other"):
        check_packing(_CumulativeLM(), row)
    with pytest.raises(ConfigError, match="takes no position_ids"):
        check_packing(_NoPositions(), row)
    # a GPT-2 that builds a cache (transformers' default, in training too) ignores the boundaries
    with pytest.raises(ConfigError, match=r"set model.config.use_cache = False"):
        check_packing(_gpt2(use_cache=True), row)
