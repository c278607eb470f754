"""YAML job files: the flags' schema, flags over the file, readable errors (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import Cli
from .test_cli import _explain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def _no_spark(*argv: str) -> Cli:
    return Cli(argv, master=None, timeout=120)


def _job_file(tmp: Path) -> Cli:
    job = tmp / "job.yaml"
    job.write_text(
        "dataset: fashion-mnist\nmodel: cnn\nepochs: 5\nbatch-size: 32\nlr: 0.05\n"
        "strategy: average\nstrategy_options: {period: 4}\ntensorboard: true\nout: runs/a\n"
    )
    return _no_spark("train", "--config", str(job), "--epochs", "2", "--print-config")


@pytest.mark.cli(build=_job_file)
def test_a_job_file_sets_defaults_and_flags_override_it(cli, tmp_path, capsys):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    effective = yaml.safe_load(proc.stdout)
    assert effective["epochs"] == 2  # the flag wins
    assert (effective["batch_size"], effective["lr"], effective["strategy"]) == (32, 0.05, "average")
    assert effective["strategy_options"] == {"period": 4} and effective["tensorboard"] is True
    assert effective["memory_format"] == "auto"  # untouched defaults are shown too
    # what --print-config prints is itself a job file that gives the same configuration
    again = tmp_path / "again.yaml"
    again.write_text(proc.stdout)
    from sparkdp.cli.main import main

    assert main(["train", "--config", str(again), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == effective


def _bad_job_file(tmp: Path, text: str, message: str) -> Cli:
    (tmp / "job.yaml").write_text(text)
    return _no_spark("train", "--config", str(tmp / "job.yaml"), "--print-config")


@pytest.mark.cli(build=_bad_job_file)
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
def test_a_bad_job_file_names_the_key_the_value_and_what_is_allowed(cli, text, message):
    (proc,) = cli.procs
    assert proc.returncode == 2, _explain(proc)
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.cli(build=lambda tmp: _no_spark("report", str(tmp), "--out", str(tmp / "r")))
def test_report_on_a_directory_that_is_not_a_run(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2 and "is not a sparkdp run: it has no run.jsonl" in proc.stderr, _explain(proc)


def _unwritable_out(tmp: Path) -> Cli:
    blocker = tmp / "file"
    blocker.write_text("")
    return _no_spark(
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


@pytest.mark.cli(build=_unwritable_out)
def test_an_unwritable_output_directory_fails_at_the_start(cli):
    (proc,) = cli.procs
    assert proc.returncode == 2 and "cannot write the run log" in proc.stderr, _explain(proc)
