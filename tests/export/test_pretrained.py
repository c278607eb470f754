"""save_pretrained without Spark: what it writes is opened by Hugging Face's own
``AutoModelForCausalLM`` / ``AutoTokenizer`` / ``PeftModel.from_pretrained`` and gives the
in-memory model's logits; the built-in gpt as GPT-2; PEFT adapters and merging; bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch

from sparkdp.data.text import EOS_TOKEN, train_bpe_tokenizer
from sparkdp.errors import ConfigError
from sparkdp.export import pretrained
from sparkdp.export.gpt2 import gpt2_state
from sparkdp.export.record import build_model, model_record
from sparkdp.models.gpt import gpt
from sparkdp.train.checkpoint import checkpoint_payload, parse_checkpoint
from sparkdp.train.checkpoint_store import encode
from sparkdp.train.result import TrainResult

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.timeout(120)

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the end of the story"] * 10


def result_of(model: torch.nn.Module) -> TrainResult:
    return TrainResult(model, [], "allreduce", 1, 1, 0.0, 0.0, 0)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every tensor moved off its initial value (LayerNorms start at 1 and 0,
    biases at 0: a mapping that mixed them up would still match an untrained model)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, 300)


def hf_gpt2(vocab: int) -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def test_builtin_gpt_opens_as_gpt2_with_its_logits_and_tokenizer(tmp_path, tokenizer):
    vocab = tokenizer.get_vocab_size()
    model = perturbed(gpt(vocab_size=vocab, block_size=16, n_layer=2, n_head=4, d_model=32))
    result_of(model).save_pretrained(tmp_path / "out", tokenizer=tokenizer)

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied on load
    ids = torch.randint(0, vocab, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert max_diff(hf(input_ids=ids).logits, model(ids).logits) <= 1e-4
    assert hf.config.eos_token_id == tokenizer.token_to_id(EOS_TOKEN)

    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    encoded = hf_tokenizer("the cat ran")
    assert set(encoded) == {"input_ids", "attention_mask"}  # no token_type_ids for GPT-2 to embed
    assert encoded["input_ids"] == tokenizer.encode("the cat ran").ids
    assert hf_tokenizer.eos_token == EOS_TOKEN


def test_weights_over_max_shard_size_are_sharded_with_an_index(tmp_path):
    model = perturbed(gpt(vocab_size=300, block_size=16, n_layer=2, n_head=2, d_model=32))
    result_of(model).save_pretrained(tmp_path / "out", max_shard_size="20KB")

    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((tmp_path / "out" / f).is_file() for f in files)
    assert not (tmp_path / "out" / "model.safetensors").exists()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        assert max_diff(hf(input_ids=ids).logits, model(ids).logits) <= 1e-4


def test_hf_model_and_a_wrapped_tokenizer(tmp_path, tokenizer):
    model = perturbed(hf_gpt2(tokenizer.get_vocab_size()))
    result_of(model).save_pretrained(tmp_path / "out", tokenizer=tokenizer)

    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, tokenizer.get_vocab_size(), (2, 16))
    with torch.no_grad():
        assert max_diff(back(input_ids=ids).logits, model(input_ids=ids).logits) <= 1e-4
    assert "token_type_ids" not in transformers.AutoTokenizer.from_pretrained(tmp_path / "out")("a dog")

    # an HF tokenizer that returns token_type_ids, which GPT-2 would embed: saved without them
    typed = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_input_names=["input_ids", "token_type_ids", "attention_mask"]
    )
    assert "token_type_ids" in typed("a dog")
    result_of(model).save_pretrained(tmp_path / "typed", tokenizer=typed)
    assert set(transformers.AutoTokenizer.from_pretrained(tmp_path / "typed")("a dog")) == {
        "input_ids",
        "attention_mask",
    }
    assert "token_type_ids" in typed("a dog")  # the caller's tokenizer is left as it was


def lora_trained(base_dir) -> torch.nn.Module:
    """A LoRA-wrapped GPT-2 from the "pretrained" ``base_dir`` after three AdamW steps (LoRA's B
    starts at zero: untrained adapters would change nothing)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    model = peft.get_peft_model(base, config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 300, (4, 16), generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    return model.eval()


def test_peft_adapter_and_merged_export(tmp_path):
    hf_gpt2(300).save_pretrained(tmp_path / "base")
    model = lora_trained(tmp_path / "base")
    ids = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    result = result_of(model)
    result.save_pretrained(tmp_path / "adapter")
    result.save_pretrained(tmp_path / "merged", merge_adapters=True)

    names = set(os.listdir(tmp_path / "adapter"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & {"model.safetensors", "config.json"}
    adapter_bytes = (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size
    assert adapter_bytes <= 0.2 * (tmp_path / "base" / "model.safetensors").stat().st_size

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    opened = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert max_diff(opened(input_ids=ids).logits, expected) <= 1e-4
        assert max_diff(merged(input_ids=ids).logits, expected) <= 1e-4
        # the adapters matter (the comparison is not one of two base models) ...
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
        assert max_diff(plain(input_ids=ids).logits, expected) > 1e-3
        # ... and merging a copy left the result's own model wrapped
        assert any("lora_A" in n for n, _ in model.named_parameters())
        assert max_diff(model(input_ids=ids).logits, expected) == 0.0


def test_an_existing_directory_is_never_replaced_and_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    model = gpt(vocab_size=300, block_size=16, n_layer=1, n_head=2, d_model=16)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("good")
    with pytest.raises(ConfigError, match="already exists and is not an empty directory"):
        result_of(model).save_pretrained(tmp_path / "taken")
    assert os.listdir(tmp_path / "taken") == ["keep.txt"]

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pretrained, "write_safetensors", broken)
    with pytest.raises(OSError, match="disk full"):
        result_of(model).save_pretrained(tmp_path / "new")
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # no target, no temporary directory left

    (tmp_path / "empty").mkdir()  # an empty directory is a target like a new path
    monkeypatch.undo()
    result_of(model).save_pretrained(tmp_path / "empty")
    assert (tmp_path / "empty" / "model.safetensors").is_file()


def test_bad_models_options_and_tokenizers_get_one_clear_error(tmp_path, tokenizer):
    with pytest.raises(ConfigError, match="a Linear has no Hugging Face format"):
        result_of(torch.nn.Linear(2, 2)).save_pretrained(tmp_path / "a")
    with pytest.raises(ConfigError, match="merge_adapters applies to PEFT models only"):
        result_of(hf_gpt2(300)).save_pretrained(tmp_path / "b", merge_adapters=True)
    with pytest.raises(ConfigError, match="a dict is not a tokenizer"):
        result_of(hf_gpt2(300)).save_pretrained(tmp_path / "c", tokenizer={"a": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        result_of(hf_gpt2(300)).save_pretrained(tmp_path / "d", tokenizer=tmp_path / "none.json")
    assert os.listdir(tmp_path) == []


def test_gpt2_state_refuses_entries_gpt2_has_no_place_for():
    state = gpt(vocab_size=300, block_size=16, n_layer=1, n_head=2, d_model=16).state_dict()
    with pytest.raises(ConfigError, match=r"GPT-2 has no place for \(extra\.weight\)"):
        gpt2_state({**state, "extra.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="export the whole model"):
        gpt2_state({k: v for k, v in state.items() if k != "ln_f.bias"})


def test_records_rebuild_the_architecture_and_travel_in_model_json_and_checkpoints(tmp_path):
    builtin = gpt(vocab_size=300, block_size=16, n_layer=1, n_head=2, d_model=16, dropout=0.1)
    for model in (builtin, hf_gpt2(300)):
        rebuilt = build_model(json.loads(json.dumps(model_record(model))))
        assert type(rebuilt) is type(model)
        assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {
            k: v.shape for k, v in model.state_dict().items()
        }
    assert model_record(torch.nn.Linear(2, 2)) is None

    result_of(builtin).save(tmp_path / "model.safetensors")
    sidecar = json.loads((tmp_path / "model.json").read_text())
    assert sidecar["model"] == {
        "type": "sparkdp-gpt",
        "arguments": {
            "vocab_size": 300,
            "block_size": 16,
            "n_layer": 1,
            "n_head": 2,
            "d_model": 16,
            "dropout": 0.1,
        },
    }

    fields = dict(epoch=1, step=0, model={}, optimizer=b"", strategy_state={}, rng=[], history=[], workers=2)
    record = model_record(hf_gpt2(300))
    saved = parse_checkpoint(encode(checkpoint_payload(**fields, model_record=record), "job", "ckpt"), "x")
    assert saved.model_record == record and saved.model_record["class"] == "GPT2LMHeadModel"
    older = checkpoint_payload(**fields)
    del older["model_record"]  # a checkpoint written before checkpoints recorded their model
    assert parse_checkpoint(encode(older, "job", "ckpt"), "x").model_record is None


def test_records_that_are_not_sparkdps_are_refused():
    with pytest.raises(ConfigError, match="not one sparkdp writes"):
        build_model({"type": "pickle", "arguments": {}})
    with pytest.raises(ConfigError, match="'os' is not a Hugging Face model class"):
        build_model({"type": "transformers", "class": "os", "config": {"model_type": "gpt2"}})


def test_export_rebuilds_a_peft_model_from_a_whole_checkpoint_and_merges_on_request(tmp_path):
    from sparkdp.config import CheckpointConfig
    from sparkdp.export.from_checkpoint import export_checkpoint
    from sparkdp.train.checkpoint import CheckpointPolicy, save_checkpoint

    hf_gpt2(300).save_pretrained(tmp_path / "base")
    model = lora_trained(tmp_path / "base")
    policy = CheckpointPolicy(CheckpointConfig(checkpoint_dir=str(tmp_path / "ckpt")))
    save_checkpoint(
        policy,
        epoch=1,
        step=0,
        model=model.state_dict(),
        optimizer=b"",
        strategy_state={},
        rng=[],
        history=[],
        workers=2,
        model_record=model_record(model),
    )
    export_checkpoint(tmp_path / "ckpt", tmp_path / "adapter")
    export_checkpoint(tmp_path / "ckpt", tmp_path / "merged", merge_adapters=True)

    ids = torch.randint(0, 300, (2, 16))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    opened = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        assert max_diff(opened(input_ids=ids).logits, expected) <= 1e-4
        assert max_diff(merged(input_ids=ids).logits, expected) <= 1e-4

    older = CheckpointPolicy(CheckpointConfig(checkpoint_dir=str(tmp_path / "old")))
    fields = dict(epoch=1, step=0, optimizer=b"", strategy_state={}, rng=[], history=[], workers=1)
    save_checkpoint(older, model=hf_gpt2(300).state_dict(), **fields)
    with pytest.raises(ConfigError, match="does not say which model it holds"):
        export_checkpoint(tmp_path / "old", tmp_path / "x")
    config = tmp_path / "base" / "config.json"
    export_checkpoint(tmp_path / "old", tmp_path / "from-config", hf_config=config)
    assert (tmp_path / "from-config" / "model.safetensors").is_file()
    assert not (tmp_path / "x").exists()


def test_an_adapters_only_checkpoint_exports_its_adapter_and_merges_with_the_base_it_names(tmp_path):
    # what training writes for a PEFT model: the trainable part only (sparkdp.frozen)
    from sparkdp.config import CheckpointConfig
    from sparkdp.export.from_checkpoint import export_checkpoint
    from sparkdp.frozen import trainable_state
    from sparkdp.train.checkpoint import CheckpointPolicy, save_checkpoint

    hf_gpt2(300).save_pretrained(tmp_path / "base")
    model = lora_trained(tmp_path / "base")
    adapters = trainable_state(model, model.state_dict())
    assert 0 < len(adapters) < len(model.state_dict())
    policy = CheckpointPolicy(CheckpointConfig(checkpoint_dir=str(tmp_path / "ckpt")))
    fields = dict(epoch=1, step=0, optimizer=b"", strategy_state={}, rng=[], history=[], workers=2)
    save_checkpoint(policy, model=adapters, model_record=model_record(model), **fields)

    export_checkpoint(tmp_path / "ckpt", tmp_path / "adapter")
    with pytest.raises(ConfigError, match="holds the adapters only.*--base DIR"):
        export_checkpoint(tmp_path / "ckpt", tmp_path / "refused", merge_adapters=True)
    assert not (tmp_path / "refused").exists()
    export_checkpoint(tmp_path / "ckpt", tmp_path / "merged", merge_adapters=True, base=tmp_path / "base")

    ids = torch.randint(0, 300, (2, 16))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    opened = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).logits
        assert max_diff(opened(input_ids=ids).logits, expected) <= 1e-4
        assert max_diff(merged(input_ids=ids).logits, expected) <= 1e-4
