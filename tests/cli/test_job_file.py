"""YAML job files: the flags' schema, flags over the file, readable errors (no Spark needed)."""

from __future__ import annotations

import pytest
import yaml

from .test_cli import _explain, sparkdp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_job_file_sets_defaults_and_flags_override_it(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        "dataset: fashion-mnist\nmodel: cnn\nepochs: 5\nbatch-size: 32\nlr: 0.05\n"
        "strategy: average\nstrategy_options: {period: 4}\ntensorboard: true\nout: runs/a\n"
    )
    proc = sparkdp("train", "--config", str(job), "--epochs", "2", "--print-config")
    assert proc.returncode == 0, _explain(proc)
    effective = yaml.safe_load(proc.stdout)
    assert effective["epochs"] == 2  # the flag wins
    assert (effective["batch_size"], effective["lr"], effective["strategy"]) == (32, 0.05, "average")
    assert effective["strategy_options"] == {"period": 4} and effective["tensorboard"] is True
    assert effective["memory_format"] == "auto"  # untouched defaults are shown too
    # what --print-config prints is itself a job file that gives the same configuration
    again = tmp_path / "again.yaml"
    again.write_text(proc.stdout)
    assert yaml.safe_load(sparkdp("train", "--config", str(again), "--print-config").stdout) == effective


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epochs: 2\nbatch_sise: 32\n", "unknown setting 'batch_sise' (did you mean 'batch_size'?)"),
        ("epochs: two\n", "epochs is 'two' (str); expected an integer"),
        ("memory_format: nhwc\n", "expected one of auto, channels_last, contiguous"),
        ("show_progress: 1\n", "show_progress is 1 (int); expected true or false"),
        ("- epochs\n", "must be a mapping of setting: value"),
        ("epochs: [1\n", "is not valid YAML"),
    ],
)
def test_a_bad_job_file_names_the_key_the_value_and_what_is_allowed(tmp_path, text, message):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    proc = sparkdp("train", "--config", str(job), "--print-config")
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_report_on_a_directory_that_is_not_a_run(tmp_path):
    proc = sparkdp("report", str(tmp_path), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "is not a sparkdp run: it has no run.jsonl" in proc.stderr, _explain(proc)


def test_an_unwritable_output_directory_fails_at_the_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = sparkdp(
        "train",
        "--dataset",
        "fashion-mnist",
        "--model",
        "linear",
        "--limit",
        "200",
        "--workers",
        "1",
        "--out",
        str(blocker / "run"),
    )
    assert proc.returncode == 2 and "cannot write the run log" in proc.stderr, _explain(proc)
