"""LoRA adapters (``peft.get_peft_model``) on a "pretrained" Hugging Face GPT-2 (built from a
config, written with ``save_pretrained`` and read back with ``from_pretrained``) trained by ``fit``
on 2 workers from a DataFrame.

Under ``allreduce`` the job takes full-batch AdamW steps (2 workers x 16 rows = the 32 rows), so
the order the rows arrive in does not matter and the adapters must equal a plain PyTorch loop's
on one process. Every strategy must leave the base as it was and hand back (and checkpoint) the
adapters only.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import sparkdp
from sparkdp.train.checkpoint import latest_checkpoint

pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

VOCAB, BLOCK, ROWS, LR = 96, 16, 32, 1e-2


def lora_gpt2(directory: Path) -> torch.nn.Module:
    """A 2-layer GPT-2 saved as a pretrained checkpoint, loaded back and wrapped with LoRA on its
    attention and MLP projections."""
    import peft
    import transformers

    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0  # runs differ in nothing random
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    base = transformers.GPT2LMHeadModel.from_pretrained(directory)
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, init_lora_weights=False
    )
    torch.manual_seed(1)  # init_lora_weights=False: both A and B random, so the first step moves both
    return peft.get_peft_model(base, lora)


def _blocks() -> torch.Tensor:
    return torch.randint(1, VOCAB, (ROWS, BLOCK), generator=torch.Generator().manual_seed(2))


def _frame(spark, blocks: torch.Tensor):
    rows = [(b.tolist(), b.tolist()) for b in blocks]
    return spark.createDataFrame(rows, "input_ids array<bigint>, labels array<bigint>").repartition(2)


def _adapters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _base(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone().float() for n, p in model.named_parameters() if not p.requires_grad}


def _fit(spark, model, blocks, strategy: str, tmp_path: Path, **options):
    frame = _frame(spark, blocks)
    if options.pop("parquet", False):  # a Parquet scan: the workers read it and save their own shards
        frame.write.parquet(str(tmp_path / "blocks"))
        frame = spark.read.parquet(str(tmp_path / "blocks"))
    return sparkdp.fit(
        model,
        frame,
        features=["input_ids", "labels"],
        dict_batches=True,
        loss="model",
        optimizer="adamw",
        optimizer_options={"lr": LR},
        strategy=strategy,
        workers=2,
        batch_size=ROWS // 2,
        epochs=options.pop("epochs", 3),
        checkpoint_dir=str(tmp_path / "ckpt"),
        spark=spark,
        show_progress=False,
        **options,
    )


def _one_process(model: torch.nn.Module, blocks: torch.Tensor, steps: int) -> dict[str, torch.Tensor]:
    """The reference: a plain loop of full-batch AdamW steps on a copy, float32."""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=blocks, labels=blocks).loss.backward()
        optimizer.step()
    return _adapters(model)


def test_lora_under_allreduce_trains_the_adapters_as_one_process_and_keeps_only_them(spark, tmp_path):
    model = lora_gpt2(tmp_path / "base")
    blocks = _blocks()
    base, before = _base(model), _adapters(model)
    want = _one_process(model, blocks, steps=3)

    result = _fit(spark, model, blocks, "allreduce", tmp_path)

    got = _adapters(result.model)
    assert got.keys() == want.keys() and len(got) == 8  # A and B of 2 projections in 2 layers
    assert max((got[k] - before[k]).abs().max().item() for k in got) > 1e-3  # they trained
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=2e-5, msg=name)
    assert _base(result.model).keys() == base.keys()
    for name, value in _base(result.model).items():
        assert torch.equal(value, base[name]), name
    assert result.state_dict().keys() == want.keys()  # no buffer in GPT-2's state dict either
    checkpoint = latest_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.model.keys() == want.keys()

    path = result.save(tmp_path / "adapters.safetensors")
    from safetensors.torch import load_file

    assert load_file(path).keys() == want.keys()
    assert str(tmp_path / "base") in path.with_suffix(".json").read_text()  # the base it needs


def _shard_keys(directory: Path) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for file in directory.rglob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            keys.update(f.keys())
    return keys


def test_lora_under_fsdp_with_a_bf16_base_trains_only_the_fp32_adapters(spark, tmp_path):
    model = lora_gpt2(tmp_path / "base")
    blocks = _blocks()
    base, before = _base(model), _adapters(model)

    result = _fit(spark, model, blocks, "fsdp", tmp_path, precision="bf16-mixed", parquet=True)

    got = _adapters(result.model)
    assert got.keys() == before.keys() and all(v.dtype == torch.float32 for v in got.values())
    assert max((got[k] - before[k]).abs().max().item() for k in got) > 1e-3
    for name, value in _base(result.model).items():
        assert torch.equal(value, base[name]), name
    # the adapters are their own shard units, beside the 2 blocks and the root
    assert result.strategy_options["shard_units"] == 8 + 2 + 1
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    checkpoint = latest_checkpoint(tmp_path / "ckpt")
    assert checkpoint is not None and checkpoint.shards  # each rank wrote its own shards
    saved = {k for k in _shard_keys(tmp_path / "ckpt") if k.startswith("model.")}
    assert saved == {f"model.{k}" for k in got}, sorted(saved)[:4]


@pytest.mark.parametrize(
    "strategy, options",
    [
        ("average", {"strategy_options": {"period": 2}}),
        ("diloco", {"strategy_options": {"period": 2}, "parquet": True}),
        ("hsdp", {"strategy_options": {"shard_size": 2}, "precision": "bf16-mixed"}),
    ],
)
def test_lora_trains_under_the_other_synchronous_strategies_with_the_base_frozen(
    spark, tmp_path, strategy, options
):
    model = lora_gpt2(tmp_path / "base")
    blocks = _blocks()
    base, before = _base(model), _adapters(model)

    result = _fit(spark, model, blocks, strategy, tmp_path, epochs=2, **options)

    got = _adapters(result.model)
    assert got.keys() == before.keys()
    assert max((got[k] - before[k]).abs().max().item() for k in got) > 1e-3
    for name, value in _base(result.model).items():
        assert torch.equal(value, base[name]), name
    assert result.state_dict().keys() == got.keys()
