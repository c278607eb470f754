"""Fine-tuning end to end, as docs/guide/fine-tuning.md describes it: a local "pretrained" Hugging
Face GPT-2 (built from a config, written with ``save_pretrained``), a table of prompt/completion
pairs tokenized and packed on the executors (``tokenize_examples``), LoRA adapters trained by
``fit`` on 2 workers (``allreduce``, and ``fsdp`` with a bfloat16 base), exported with
``result.save_pretrained`` and with ``sparkdp export`` from the job's checkpoints.

The reference is PEFT's own ``PeftModel.from_pretrained`` on a fresh copy of the base: it must
give the in-memory result's logits, and both exports the same adapter. One fit per strategy
serves every assertion.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import sparkdp
from sparkdp.cli.main import main
from sparkdp.data.text import EOS_TOKEN, train_bpe_tokenizer
from sparkdp.spark.text import tokenize_examples

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

BLOCK = 32
WORDS = "red orange yellow green blue violet black white north south east west".split()
COLUMNS = ["input_ids", "labels", "position_ids"]


def pairs(n: int = 48) -> list[tuple[str, str]]:
    """Two consecutive words of a looping list, then the next two."""
    w = lambda i: WORDS[i % len(WORDS)]  # noqa: E731
    return [(f"after {w(i)} {w(i + 1)}", f" {w(i + 2)} {w(i + 3)}") for i in range(n)]


def pretrained(directory: Path, tokenizer) -> Path:
    eos = tokenizer.token_to_id(EOS_TOKEN)
    config = transformers.GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=BLOCK,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def open_base(directory: Path) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    model.config.use_cache = False  # packed rows: no cache, so the block-diagonal mask applies
    return model


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits.float()


@dataclass(frozen=True)
class Run:
    strategy: str
    tmp: Path
    base: Path
    result: sparkdp.TrainResult
    tokenizer: object  # the tokenizers.Tokenizer trained on the pairs
    ids: torch.Tensor  # token rows the logits are compared on
    initial: torch.Tensor  # the untrained LoRA model's logits on them


@pytest.fixture(scope="module", params=["allreduce", "fsdp"])
def run(request, spark, tmp_path_factory) -> Run:
    """One LoRA fine-tune: allreduce in float32, fsdp with the frozen base stored in bfloat16 and
    sharded checkpoints."""
    strategy = request.param
    tmp = tmp_path_factory.mktemp(f"fine-tune-{strategy}")
    tokenizer = train_bpe_tokenizer([p + c for p, c in pairs()], 120)
    tokenizer.save(str(tmp / "tokenizer.json"))
    base = pretrained(tmp / "base", tokenizer)
    table = spark.createDataFrame(pairs(), "prompt string, completion string").repartition(2)
    tokenized = tokenize_examples(
        table, prompt="prompt", completion="completion", tokenizer=tokenizer, block_size=BLOCK
    )
    # written once as Parquet, which the workers read themselves: fsdp's workers then save their
    # own shards (a streamed DataFrame's epochs are checkpointed whole on the driver)
    tokenized.write.parquet(str(tmp / "rows"))
    rows = spark.read.parquet(str(tmp / "rows"))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)
    model = peft.get_peft_model(open_base(base), lora)
    ids = torch.tensor([r.input_ids for r in rows.select("input_ids").limit(2).collect()])
    initial = logits(model, ids)
    result = sparkdp.fit(
        model,
        rows,
        features=COLUMNS,
        dict_batches=True,
        loss="model",
        optimizer="adamw",
        optimizer_options={"lr": 1e-2},
        strategy=strategy,
        precision="bf16-mixed" if strategy == "fsdp" else "32",
        workers=2,
        batch_size=2,
        epochs=1,
        checkpoint_dir=str(tmp / "ckpt"),
        spark=spark,
        show_progress=False,
    )
    return Run(strategy, tmp, base, result, tokenizer, ids, initial)


def test_the_exported_adapter_opens_in_peft_with_the_results_logits_at_a_fifth_of_the_bytes(run):
    expected = logits(run.result.model, run.ids)
    assert (expected - run.initial).abs().max() > 1e-3  # it trained: not two untrained models compared

    adapter = run.result.save_pretrained(run.tmp / "adapter", tokenizer=str(run.tmp / "tokenizer.json"))

    reopened = peft.PeftModel.from_pretrained(open_base(run.base), adapter)
    assert {p.dtype for p in reopened.parameters()} == {torch.float32}
    assert (logits(reopened, run.ids) - expected).abs().max() <= 1e-4
    adapter_bytes = (adapter / "adapter_model.safetensors").stat().st_size
    model_bytes = (run.base / "model.safetensors").stat().st_size
    assert adapter_bytes <= 0.2 * model_bytes, (adapter_bytes, model_bytes)
    tokenizer = transformers.AutoTokenizer.from_pretrained(adapter)  # saved beside the adapter
    assert tokenizer("after red blue")["input_ids"] == run.tokenizer.encode("after red blue").ids


def test_sparkdp_export_of_the_jobs_checkpoints_gives_the_same_adapter(run):
    from safetensors.torch import load_file

    series = "shards-" if run.strategy == "fsdp" else "ckpt-"
    assert any(p.name.startswith(series) for p in (run.tmp / "ckpt").iterdir())
    saved = run.tmp / "saved"
    if not saved.exists():
        run.result.save_pretrained(saved)

    assert main(["export", str(run.tmp / "ckpt"), str(run.tmp / "exported")]) == 0

    got, want = (load_file(str(d / "adapter_model.safetensors")) for d in (run.tmp / "exported", saved))
    assert got.keys() == want.keys() and len(got) == 8  # A and B of 2 projections in 2 layers
    assert {v.dtype for v in got.values()} == {torch.float32}  # fsdp's bf16 base left the adapters fp32
    for name in want:
        assert torch.equal(got[name], want[name]), name
    reopened = peft.PeftModel.from_pretrained(open_base(run.base), run.tmp / "exported")
    assert (logits(reopened, run.ids) - logits(run.result.model, run.ids)).abs().max() <= 1e-4
