"""Token ids and block lengths checked against the model's embeddings before training."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError
from sparkdp.models import build_model
from sparkdp.train.tokens import TokenLimits, check_token_batch, position_count, vocabulary_size

pytestmark = pytest.mark.timeout(60)


def _gpt():
    return build_model("gpt-tiny", vocab_size=50, block_size=8)


def test_a_batch_within_the_vocabulary_and_positions_passes_and_ignored_labels_do_not_count():
    model = _gpt()
    ids = torch.tensor([[0, 49, 3, 4, 5, 6, 7, 8]])
    labels = ids.clone()
    labels[0, :2] = -100
    check_token_batch(model, {"input_ids": ids, "labels": labels})
    assert (vocabulary_size(model), position_count(model)) == (50, 8)
    model(input_ids=ids, labels=labels)  # what the check let through, the model takes


def test_an_id_past_the_vocabulary_is_named_with_the_models_size():
    model = _gpt()
    ids = torch.tensor([[1, 2, 50]])
    with torch.no_grad(), pytest.raises(IndexError, match="index out of range"):
        model(input_ids=ids)  # the bare error the check stands in front of
    with pytest.raises(
        ConfigError, match=r"input_ids holds token ids from 1 to 50, but GPT embeds 50 tokens"
    ):
        check_token_batch(model, {"input_ids": ids})
    with pytest.raises(ConfigError, match=r"labels holds token ids from 1 to 70"):
        check_token_batch(model, {"input_ids": ids.clamp(max=49), "labels": torch.tensor([[1, -100, 70]])})


def test_a_block_longer_than_the_positions_is_refused():
    with pytest.raises(ConfigError, match="blocks of 9 tokens, but GPT has 8 positions"):
        check_token_batch(_gpt(), {"input_ids": torch.zeros(2, 9, dtype=torch.int64)})


def test_a_hugging_face_model_is_read_from_its_embeddings_and_config():
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=30, n_positions=12, n_embd=16, n_layer=1, n_head=2)
    )
    assert (vocabulary_size(model), position_count(model)) == (30, 12)
    with pytest.raises(ConfigError, match="GPT2LMHeadModel embeds 30 tokens"):
        check_token_batch(model, {"input_ids": torch.tensor([[29, 30]])})


def test_the_cheap_check_finds_one_bad_id_in_a_late_row_and_lets_ignored_labels_pass():
    """TokenLimits.check runs on every batch: one max and one min find an id anywhere in it, and
    a negative id is refused unless it is the loss's ignore index in the labels."""
    limits = TokenLimits.of(_gpt())
    assert limits is not None
    ids = torch.randint(0, 50, (32, 8))
    labels = ids.clone()
    labels[:, :3] = -100
    limits.check({"input_ids": ids, "labels": labels})  # in range, prompts masked: passes
    ids[31, 7] = 50  # the last row's last token only
    with pytest.raises(
        ConfigError, match=r"batch 9: input_ids holds token ids from 0 to 50, but GPT embeds 50"
    ):
        limits.check({"input_ids": ids, "labels": labels}, "batch 9")
    ids[31, 7] = 0
    labels[31, 7] = -5  # negative, and not the ignore index
    with pytest.raises(ConfigError, match=r"labels holds token ids from -5 to"):
        limits.check({"input_ids": ids, "labels": labels})
    with pytest.raises(ConfigError, match=r"input_ids holds token ids from -100"):
        limits.check({"input_ids": torch.full((2, 4), -100)})  # -100 is no ignore index in the inputs
    assert TokenLimits.of(torch.nn.Linear(2, 2)) is None  # states no limits: nothing to check
