"""`sparkdp train --dataset fortunes --model gpt`: model options and the packed corpus on disk."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from sparkdp.cli.main import build_parser
from sparkdp.cli.text_job import text_job
from sparkdp.data.text_datasets import FORTUNES_DIR, load_text_dataset
from sparkdp.errors import ConfigError

from .test_cli import _explain, sparkdp

needs_fortunes = pytest.mark.skipif(
    not FORTUNES_DIR.is_dir(), reason="the Debian package `fortunes` is not installed"
)


def test_model_options_are_parsed_as_json_values():
    args = build_parser().parse_args(
        [
            "train",
            "--model",
            "gpt",
            "--model-option",
            "n_layer=4",
            "--model-option",
            "dropout=0.1",
            "--model-option",
            "d_model=128",
        ]
    )
    assert args.model_options == {"n_layer": 4, "dropout": 0.1, "d_model": 128}


def test_a_text_corpus_needs_a_language_model():
    with pytest.raises(ConfigError, match="trains a language model: --model gpt, gpt-tiny"):
        text_job("fortunes", "cnn", {}, limit=10)


@needs_fortunes
def test_the_corpus_is_packed_for_the_models_vocabulary_and_context(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    job = text_job("fortunes", "gpt-tiny", {"block_size": 32}, limit=300)
    # gpt-tiny's preset vocabulary (256) and the option's context (32) reach both the model and the tokenizer
    assert job.model_args == {"vocab_size": 256, "block_size": 32}
    assert job.columns == {"features": ["input_ids", "labels"], "dict_batches": True}
    ds = load_text_dataset("fortunes", limit=300, vocab_size=256, block_size=32)
    for path, blocks in ((job.data, ds.train_blocks), (job.eval_data, ds.validation_blocks)):
        table = pq.read_table(path)
        assert table.column_names == ["input_ids", "labels"]
        np.testing.assert_array_equal(np.array(table.column("input_ids").to_pylist()), blocks)
        np.testing.assert_array_equal(np.array(table.column("labels").to_pylist()), blocks)


@pytest.mark.e2e
@pytest.mark.slow  # examples/language_model.py trains on fortunes with loss="model" in make test
@needs_fortunes
@pytest.mark.timeout(240)
def test_train_a_tiny_gpt_on_fortunes(tmp_path):
    summary = tmp_path / "summary.json"
    proc = sparkdp(
        "train",
        "--dataset",
        "fortunes",
        "--model",
        "gpt-tiny",
        "--limit",
        "400",
        "--workers",
        "2",
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
        "--json-out",
        str(summary),
        timeout=200,
        cwd=tmp_path,
        env={"SPARKDP_CACHE": str(tmp_path)},
    )
    assert proc.returncode == 0, _explain(proc)
    history = json.loads(summary.read_text())["history"]
    assert history[-1]["loss"] < history[0]["loss"] < 6.0  # ln(256) = 5.55 at the start


# A small GPT on the first LM_DOCS cookies: few enough steps for a test, enough to beat the unigram bound.
LM_DOCS = 400
LM_OPTIONS = {"n_layer": 1, "n_head": 2, "d_model": 64, "vocab_size": 512, "block_size": 64}


def unigram_cross_entropy(limit: int) -> float:
    """The validation tokens' mean -log p(token) under the training split's token frequencies
    (add-one smoothed): the loss of the best model that ignores context. Positions 1.. only, the
    ones a causal model is scored on."""
    ds = load_text_dataset(
        "fortunes", limit=limit, vocab_size=LM_OPTIONS["vocab_size"], block_size=LM_OPTIONS["block_size"]
    )
    counts = np.bincount(ds.train_blocks[:, 1:].reshape(-1), minlength=LM_OPTIONS["vocab_size"]) + 1
    return float(-np.log(counts / counts.sum())[ds.validation_blocks[:, 1:].reshape(-1)].mean())


@needs_fortunes
@pytest.mark.timeout(120)
def test_the_gpt_job_in_bf16_with_accumulation_beats_the_unigram_bound(tmp_path, monkeypatch):
    """The fast sibling of the command-line run below: the job's Parquet blocks through the worker
    loop in this process (one worker, batch 8, accumulate 2, bf16-mixed), one epoch."""
    import torch

    from sparkdp.comm.single import SingleProcessCollective
    from sparkdp.config import TrainingConfig
    from sparkdp.data.parquet import ParquetData
    from sparkdp.models import build_model
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train.loop import FitSpec, fit_worker
    from sparkdp.train.optim import optimizer_factory, resolve_loss

    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    job = text_job("fortunes", "gpt", LM_OPTIONS, limit=LM_DOCS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker's one core; on 2 busy cores more threads only contend
    try:
        torch.manual_seed(0)
        model = build_model("gpt", **job.model_args)

        def blocks(path: str) -> ParquetData:
            return ParquetData(path, label=None, **job.columns)

        spec = FitSpec(
            model=model,
            loss=resolve_loss("model"),
            optimizer=optimizer_factory("adamw", model, lr=0.01),
            strategy=resolve_strategy("allreduce"),
            train=blocks(job.data),
            eval=blocks(job.eval_data),
            training=TrainingConfig(epochs=1, batch_size=8, precision="bf16-mixed", accumulate=2),
        )
        report = fit_worker(spec, SingleProcessCollective())
    finally:
        torch.set_num_threads(threads)
    bound = unigram_cross_entropy(LM_DOCS)  # 5.37 nats; ln(512) = 6.24 untrained
    assert report.history[-1]["test_loss"] < bound - 0.1, (report.history, bound)


@pytest.mark.e2e
@pytest.mark.slow  # a Spark job in a subprocess; the test above checks the same bound in this process
@needs_fortunes
@pytest.mark.timeout(400)
def test_sparkdp_train_gpt_in_bf16_with_accumulation_beats_the_unigram_bound(tmp_path):
    summary = tmp_path / "summary.json"
    options = [arg for key, value in LM_OPTIONS.items() for arg in ("--model-option", f"{key}={value}")]
    proc = sparkdp(
        "train",
        "--dataset",
        "fortunes",
        "--model",
        "gpt",
        *options,
        "--limit",
        str(LM_DOCS),
        "--precision",
        "bf16-mixed",
        "--accumulate",
        "2",
        "--workers",
        "2",
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--optimizer",
        "adamw",
        "--lr",
        "0.01",
        "--json-out",
        str(summary),
        timeout=360,
        cwd=tmp_path,
        env={"SPARKDP_CACHE": str(tmp_path)},
    )
    assert proc.returncode == 0, _explain(proc)
    history = json.loads(summary.read_text())["history"]
    bound = unigram_cross_entropy(LM_DOCS)
    assert history[-1]["test_loss"] < bound - 0.1, (history, bound)
