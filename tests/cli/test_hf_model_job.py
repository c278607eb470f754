"""`sparkdp train --hf-model DIR`: a local Hugging Face model trained on a table of token blocks
with the model's own loss (`--loss model`, `--dict-batches` without `--label`) and exported from
its checkpoints by `sparkdp export`, and the clear one-line refusals of what it cannot train on."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from sparkdp.data.sft import ExamplePacker
from sparkdp.data.text import write_blocks
from tests.helpers.hf_dirs import POSITIONS, VOCAB, counting_blocks, hf_loss, lm_job, tiny_gpt2_dir

from .conftest import Cli
from .test_cli import _explain

pytest.importorskip("transformers")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _train_lm(tmp: Path) -> list[Cli]:
    model, flags = lm_job(tmp, lr="0.01")
    job = tmp / "job.yaml"
    job.write_text(f"hf_model: {model}\nloss: model\ndict_batches: true\nfeatures: input_ids,labels\n")
    return [
        Cli(["train", *flags, "--loss", "model"]),
        Cli(["train", "--config", job, "--print-config"], master=None),
        Cli(["export", tmp / "ckpt", tmp / "exported"]),  # after the training run: both hold a session
    ]


@pytest.mark.cli(build=_train_lm)
def test_a_local_hf_model_trains_on_token_blocks_from_the_command_line(cli):
    import transformers

    run, printed, exported = cli.procs
    assert run.returncode == 0, _explain(run)
    summary = json.loads((cli.tmp / "summary.json").read_text())
    final = summary["history"][-1]
    # the independent reference: Hugging Face's own loss of the untrained directory on the same blocks
    eval_blocks = counting_blocks(16, seed=1)
    untrained = hf_loss(transformers.AutoModelForCausalLM.from_pretrained(cli.tmp / "gpt2"), eval_blocks)
    assert untrained > 3.5  # about ln(64) = 4.16: the model starts knowing nothing
    assert final["test_loss"] < untrained - 1.0, (final, untrained)
    # -q keeps the final result line, and it carries the language model's figures
    assert run.stdout.strip().splitlines()[-1].startswith("final: loss "), _explain(run)
    assert f"test_perplexity {final['test_perplexity']:.4f}" in run.stdout
    assert "samples/s" not in run.stdout  # (the rest stays quiet)
    # the run log counts each worker's training tokens: 32 blocks of 16 tokens per epoch, 3 epochs
    records = [json.loads(line) for line in (cli.tmp / "run" / "run.jsonl").read_text().splitlines()]
    last = [r for r in records if r["type"] == "metrics" and r["rank"] == 0][-1]
    assert (last["tokens"], last["steps"], last["samples"]) == (3 * 32 * 16, 3 * 4, 3 * 32), last
    # the newest checkpoint, exported on the command line, is the trained model as Hugging Face opens
    # it: its own loss on the held-out blocks is the job's final test loss
    assert exported.returncode == 0, _explain(exported)
    opened = transformers.AutoModelForCausalLM.from_pretrained(cli.tmp / "exported")
    assert type(opened).__name__ == "GPT2LMHeadModel"
    assert hf_loss(opened, eval_blocks) == pytest.approx(final["test_loss"], abs=1e-4)
    # the job file's keys are those of the flags
    assert printed.returncode == 0, _explain(printed)
    effective = yaml.safe_load(printed.stdout)
    assert (effective["loss"], effective["hf_model"], effective["dict_batches"]) == (
        "model",
        str(cli.tmp / "gpt2"),
        True,
    )


def _packed_rows(rows: int) -> dict[str, torch.Tensor]:
    """Fine-tuning rows as tokenize_examples packs them: two 6-token counting examples per
    16-token row, each example's first 3 tokens a prompt (label -100), position_ids restarting."""
    packer = ExamplePacker(POSITIONS, 0, True, "truncate")
    examples = [(ids, [-100] * 3 + ids[3:]) for ids in counting_blocks(2 * rows, length=6).tolist()]
    batches = [b for b in (packer.add(examples), packer.finish()) if b is not None]
    table = pa.Table.from_batches(batches).select(["input_ids", "labels", "position_ids"])
    return {name: torch.tensor(table.column(name).to_pylist()) for name in table.column_names}


def _fine_tune_packed(tmp: Path) -> list[Cli]:
    model = tiny_gpt2_dir(tmp / "gpt2")
    pq.write_table(pa.table({k: v.tolist() for k, v in _packed_rows(32).items()}), tmp / "rows.parquet")
    return [
        Cli(
            [
                "train",
                "--hf-model",
                model,
                "--data",
                tmp / "rows.parquet",
                "--features",
                "input_ids,labels,position_ids",
                "--dict-batches",
                "--workers",
                "2",
                "--epochs",
                "3",
                "--batch-size",
                "4",
                "--optimizer",
                "adamw",
                "--lr",
                "0.01",
                "-q",
                "--checkpoint-dir",
                tmp / "ckpt",
            ]
        ),
        Cli(["export", tmp / "ckpt", tmp / "exported"]),
    ]


@pytest.mark.cli(build=_fine_tune_packed)
def test_packed_fine_tuning_rows_train_a_local_hf_model_and_export(cli):
    """The rows tokenize_examples packs train on --hf-model (its key/value cache is off, else the
    packing check refuses the job) and the exported model has learnt the completions."""
    import transformers

    run, exported = cli.procs
    assert run.returncode == 0, _explain(run)
    assert exported.returncode == 0, _explain(exported)
    rows = _packed_rows(32)

    def loss(directory: Path) -> float:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
        with torch.no_grad():
            return float(model(**rows).loss)

    assert loss(cli.tmp / "exported") < loss(cli.tmp / "gpt2") - 0.5


def _refused(tmp: Path, case: str, message: str) -> Cli:
    model = tiny_gpt2_dir(tmp / "gpt2")
    argv = ["train", "--hf-model", model, "--features", "input_ids,labels", "--dict-batches"]
    if case == "vocabulary":
        write_blocks(counting_blocks(8, vocab=36) + VOCAB, tmp / "t.parquet")  # ids 64..99
        return Cli([*argv, "--data", tmp / "t.parquet"])
    if case == "late-row":  # in range but for one token of the last row: past the driver's sample
        blocks = counting_blocks(64)
        blocks[-1, -1] = VOCAB + 6
        write_blocks(blocks, tmp / "t.parquet")
        return Cli(
            [*argv, "--data", tmp / "t.parquet", "--batch-size", "4", "--no-shuffle", "--workers", "2"]
        )
    if case == "positions":
        write_blocks(counting_blocks(8, length=32), tmp / "t.parquet")
        return Cli([*argv, "--data", tmp / "t.parquet"])
    if case == "pickle":
        (model / "model.safetensors").unlink()
        (model / "pytorch_model.bin").write_bytes(b"not loaded")
    return Cli([*argv, "--data", tmp / "absent.parquet"], master=None)


@pytest.mark.cli(build=_refused)
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("vocabulary", "but GPT2LMHeadModel embeds 64 tokens (ids 0..63)"),
        (
            "late-row",
            "of epoch 1: input_ids holds token ids from 0 to 70, but GPT2LMHeadModel embeds 64 tokens",
        ),
        ("positions", "blocks of 32 tokens, but GPT2LMHeadModel has 16 positions"),
        ("pickle", "has no safetensors weights (only pytorch_model.bin, a pickle sparkdp does not load)"),
    ],
)
def test_what_a_local_hf_model_cannot_train_on_is_one_clear_line(cli, case, message):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr and "Traceback" not in proc.stderr, _explain(proc)


@pytest.mark.cli(
    build=lambda tmp: Cli(
        ["train", "--model", "linear", "--data", tmp / "t.parquet", "--features", "x"], master=None
    )
)
def test_data_without_a_label_asks_for_one_or_for_dict_batches(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert "or --features COLS --dict-batches" in proc.stderr, _explain(proc)
