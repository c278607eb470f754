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
