"""`sparkdp train --hf-model DIR --lora-r R`: LoRA adapters trained on a local Hugging Face model
from the command line, exported by `sparkdp export` as an adapter that peft opens, and the
one-line refusals of LoRA settings that cannot apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.hf_dirs import counting_blocks, hf_loss, lm_job, tiny_gpt2_dir

from .conftest import Cli
from .test_cli import _explain

pytest.importorskip("transformers")
pytest.importorskip("peft")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

LORA_FLAGS = ["--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "c_attn,c_fc"]


def _train_lora(tmp: Path) -> list[Cli]:
    model, flags = lm_job(tmp, lr="0.03")
    job = tmp / "job.yaml"
    job.write_text(f"hf_model: {model}\nlora_r: 4\nlora_dropout: 0.1\nlora_target_modules: [c_attn, c_fc]\n")
    return [
        Cli(["train", *flags, *LORA_FLAGS]),
        Cli(["train", "--config", job, "--print-config"], master=None),
        Cli(["export", tmp / "ckpt", tmp / "adapter"]),
    ]


@pytest.mark.cli(build=_train_lora)
def test_lora_flags_train_adapters_that_export_as_a_peft_adapter(cli):
    import peft
    import transformers
    from safetensors.torch import load_file

    from sparkdp.frozen import load_model_state

    run, printed, exported = cli.procs
    assert run.returncode == 0, _explain(run)
    assert exported.returncode == 0, _explain(exported)
    base_dir, adapter_dir = cli.tmp / "gpt2", cli.tmp / "adapter"
    # the export is an adapter, not a whole model
    assert (adapter_dir / "adapter_config.json").is_file()
    assert (adapter_dir / "adapter_model.safetensors").is_file()
    assert not (adapter_dir / "model.safetensors").exists()
    adapter_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8)
    assert sorted(adapter_config["target_modules"]) == ["c_attn", "c_fc"]

    opened = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir
    ).eval()
    # independent of sparkdp's export: peft's own loss of the opened adapter on the held-out blocks
    # is the job's final test loss, and the adapters learnt (the base alone knows nothing: about
    # ln 64; adapters on a 1-layer model learn the counting task slowly)
    eval_blocks = counting_blocks(16, seed=1)
    final = json.loads((cli.tmp / "summary.json").read_text())["history"][-1]
    untrained = hf_loss(transformers.AutoModelForCausalLM.from_pretrained(base_dir), eval_blocks)
    assert hf_loss(opened, eval_blocks) == pytest.approx(final["test_loss"], abs=1e-4)
    assert final["test_loss"] < untrained - 0.1, (final, untrained)

    # the job's result (the run's model.safetensors: the adapters only) in a fresh LoRA model built
    # with peft's own config gives the exported adapter's logits
    saved = load_file(cli.tmp / "run" / "model.safetensors")
    assert saved and all("lora_" in name for name in saved), sorted(saved)[:5]
    fresh = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(base_dir),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True),
    ).eval()
    load_model_state(fresh, saved)
    ids = torch.as_tensor(eval_blocks, dtype=torch.int64)
    with torch.no_grad():
        diff = (fresh(input_ids=ids).logits - opened(input_ids=ids).logits).abs().max()
    assert float(diff) <= 1e-4

    # the job file's keys are the flags'
    assert printed.returncode == 0, _explain(printed)
    effective = yaml.safe_load(printed.stdout)
    assert (effective["lora_r"], effective["lora_dropout"], effective["lora_target_modules"]) == (
        4,
        0.1,
        ["c_attn", "c_fc"],
    )


def _refused(tmp: Path, case: str, message: str) -> Cli:
    model = tiny_gpt2_dir(tmp / "gpt2")
    data = ["--data", tmp / "absent.parquet", "--features", "input_ids,labels", "--dict-batches"]
    if case == "no-hf-model":
        return Cli(["train", "--model", "gpt-tiny", "--lora-r", "4", *data], master=None)
    if case == "no-rank":
        return Cli(["train", "--hf-model", model, "--lora-alpha", "16", *data], master=None)
    if case == "bad-dropout":
        return Cli(
            ["train", "--hf-model", model, "--lora-r", "4", "--lora-dropout", "1.5", *data], master=None
        )
    return Cli(
        ["train", "--hf-model", model, "--lora-r", "4", "--lora-target-modules", "q_proj", *data], master=None
    )


@pytest.mark.cli(build=_refused)
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("no-hf-model", "--lora-r wraps a Hugging Face model in LoRA adapters: give it with --hf-model DIR"),
        ("no-rank", "give their rank with lora_r (e.g. --lora-r 8) too"),
        ("bad-dropout", "lora_dropout must be a probability in [0, 1); got 1.5."),
        ("no-such-layer", "Name the layers to adapt with --lora-target-modules"),
    ],
)
def test_lora_settings_that_cannot_apply_are_one_clear_line(cli, case, message):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)
