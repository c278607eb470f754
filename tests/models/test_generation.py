"""Batched generation on one process (sparkdp.models.generation) against Hugging Face's own
generate on each prompt alone, and the sampler's per-row generators; the Spark stage around it is
tests/spark/test_generate.py."""

from __future__ import annotations

import copy

import pytest
import torch

from sparkdp.config import GenerationConfig
from sparkdp.errors import ConfigError, DataError
from sparkdp.models.generation import RowSampler, generate_texts, left_pad, row_seed
from sparkdp.models.hf_package import HFPackage
from tests.helpers.tiny_lm import PROMPTS, hf_greedy, tiny_lm

pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(
    240
)  # building the model trains it for 150 steps: seconds idle, more on a loaded machine


def test_left_padded_batches_equal_hugging_face_on_each_prompt_alone(tmp_path):
    lm = tiny_lm(tmp_path)
    model, tokenizer = HFPackage.of(tmp_path).load(torch.device("cpu"))
    got = generate_texts(model, tokenizer, PROMPTS, GenerationConfig(max_new_tokens=9, batch_size=4), PROMPTS)
    assert got == [hf_greedy(lm, p, 9) for p in PROMPTS]
    with pytest.raises(DataError, match="exceeds the model's 64 positions"):
        generate_texts(model, tokenizer, ["the cat " * 40], GenerationConfig(max_new_tokens=4), ["k"])


def test_a_peft_model_ships_merged_with_its_adapters_logits(tmp_path):
    peft = pytest.importorskip("peft")
    lm = tiny_lm(tmp_path)
    lora = peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    torch.manual_seed(0)  # init_lora_weights=False: random A and B, so the adapters change the logits
    wrapped = peft.get_peft_model(copy.deepcopy(lm.model), lora).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = wrapped(input_ids=ids).logits
        assert (want - lm.model(input_ids=ids).logits).abs().max() > 1e-3

    shipped, _ = HFPackage.of(wrapped, tokenizer=lm.tokenizer).load(torch.device("cpu"))

    assert not hasattr(shipped, "peft_config")
    with torch.no_grad():
        assert (shipped(input_ids=ids).logits - want).abs().max() <= 1e-5
    assert hasattr(wrapped, "peft_config"), "the model passed in keeps its adapters"


def test_left_pad_and_row_seeds():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert row_seed(1, "a") == row_seed(1, "a") != row_seed(2, "a") != row_seed(1, "b")
    assert 0 <= row_seed(0, "x") < 2**63


def test_each_row_draws_from_its_own_generator():
    config = GenerationConfig(do_sample=True, top_k=2)
    scores = torch.tensor([[0.0, 5.0, 4.9, -1.0], [3.0, 0.0, 0.0, 2.9]])
    alone = RowSampler([11], config, torch.device("cpu"))(torch.zeros(1, 1), scores[1:])
    both = RowSampler([7, 11], config, torch.device("cpu"))(torch.zeros(2, 1), scores)
    assert torch.equal(both[1], alone[0]), "row 1's draw ignores row 0"
    for row, allowed in zip(both, ([1, 2], [0, 3]), strict=True):
        (chosen,) = torch.nonzero(torch.isfinite(row)).flatten().tolist()
        assert chosen in allowed, "top_k=2 keeps the two most likely tokens"
    draws = {
        int(RowSampler([s], config, torch.device("cpu"))(torch.zeros(1, 1), scores[:1]).argmax())
        for s in range(40)
    }
    assert draws == {1, 2}, "both of the top two are drawn across seeds, nothing else"


def test_bad_settings():
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        GenerationConfig(temperature=0)
    with pytest.raises(ConfigError, match="max_new_tokens must be a positive integer"):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(ConfigError, match="do_sample must be true or false"):
        GenerationConfig(do_sample="yes")  # type: ignore[arg-type]
