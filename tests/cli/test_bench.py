"""``sparkdp bench``: the matrix runner's records, summary and guards."""

from __future__ import annotations

import json

import pytest

from sparkdp.cli.main import main
from sparkdp.driver import bench
from sparkdp.errors import ConfigError


def test_strategy_choices_parse_and_unknown_names_are_listed():
    choice = bench.StrategyChoice.parse("average:period=8:average_optimizer_state=true")
    assert choice.name == "average" and choice.options == {"period": 8, "average_optimizer_state": True}
    assert choice.label == "average(period=8,average_optimizer_state=True)"
    nested = bench.StrategyChoice.parse('ddcasgd:rule_options={"lr": 0.05, "mu0": 0.8}:push_every=2')
    assert nested.options == {"rule_options": {"lr": 0.05, "mu0": 0.8}, "push_every": 2}
    with pytest.raises(ConfigError, match="unknown strategy 'nope'; choose from .*ddcasgd"):
        bench.StrategyChoice.parse("nope")
    with pytest.raises(ConfigError, match="must be KEY=VALUE"):
        bench.StrategyChoice.parse("asgd:push_every")
    with pytest.raises(ConfigError, match="unknown workload 'imagenet'; choose from fashion-mnist-cnn"):
        bench.workload("imagenet")


def test_summary_is_mean_and_sd_over_seeds_and_failures_are_kept_out():
    base = {
        "workload": "w",
        "strategy": "asgd",
        "workers": 4,
        "samples_per_s": 100.0,
        "bytes_per_sample": 2000.0,
        "cpu_util": 0.5,
        "time_to_target_s": None,
    }
    records = [
        {**base, "seed": 0, "test_accuracy": 0.80, "staleness": {"0": 3, "2": 1}},
        {**base, "seed": 1, "test_accuracy": 0.84, "staleness": {"0": 1, "1": 3}, "time_to_target_s": 5.0},
        {"workload": "w", "strategy": "asgd", "workers": 4, "seed": 2, "error": "WorkerFailed: boom"},
    ]
    (row,) = bench.summarise(records)
    assert row["seeds"] == 2 and row["accuracy_mean"] == pytest.approx(0.82)
    assert row["accuracy_sd"] == pytest.approx(0.028284, rel=1e-4)  # sample sd of 0.80 and 0.84
    assert row["staleness"] == {"0": 4, "1": 3, "2": 1} and row["reached_target"] == "1/2"
    table = bench.markdown([row])
    assert (
        "| w | asgd | 4 | 2 | 0.8200 ± 0.0283 | 100 | 2.0 | 5.0 | 1/2 | 50% | 0.62 / 0 / 2 / 2 / 2 |" in table
    )


def test_a_matrix_too_large_for_the_budget_asks_first(capsys):
    assert (
        main(
            [
                "bench",
                "--workload",
                "fashion-mnist-cnn",
                "--strategies",
                "allreduce",
                "asgd",
                "--workers",
                "2,4",
                "--seeds",
                "0,1,2",
                "--epochs",
                "10",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "12 runs of fashion-mnist-cnn, about" in err and "pass --yes" in err


@pytest.mark.spark
def test_runs_write_records_with_stable_keys(spark, tmp_path):
    work = bench.workload("fashion-mnist-mlp")
    choices = [bench.StrategyChoice.parse("allreduce"), bench.StrategyChoice.parse("asgd")]
    out = tmp_path / "runs.jsonl"
    records = bench.run_matrix(
        work, choices, [2], [0], epochs=1, limit=1024, spark=spark, out=out, echo=lambda line: None
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == json.loads(json.dumps(records))  # each run was written as it ended
    for r in lines:
        for key in (
            "strategy",
            "workers",
            "seed",
            "test_accuracy",
            "wall_s",
            "samples_per_s",
            "bytes_per_sample",
            "time_to_target_s",
        ):
            assert key in r, (key, r)
        assert r["workers"] == 2 and 0.1 < r["test_accuracy"] <= 1.0
    params = 784 * 256 + 256 + 2570
    sync, asgd = lines
    # ring all-reduce: each of 2 ranks sends half the gradient twice (2(M-1)/M · S) per step
    steps = -(-1024 // (2 * 64))
    assert sync["bytes_per_sample"] == pytest.approx(2 * steps * params * 4 / 1024, rel=0.01)
    assert asgd["staleness"] and asgd["bytes_per_sample"] > 0
    # (what `sparkdp bench --summarise` does; main() itself would stop the shared Spark session)
    rows = bench.summarise(bench.read_records([out]))
    assert bench.markdown(rows).count("| fashion-mnist-mlp |") == 2
    assert bench.plot(lines, rows, tmp_path / "results.png").stat().st_size > 10_000


def test_summarise_from_the_command_line(tmp_path, capsys):
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        json.dumps(
            {
                "workload": "w",
                "strategy": "asgd",
                "workers": 2,
                "seed": 0,
                "test_accuracy": 0.8,
                "samples_per_s": 10.0,
                "bytes_per_sample": 1.0,
                "cpu_util": 0.2,
                "time_to_target_s": None,
                "staleness": {"0": 2},
            }
        )
        + "\n"
    )
    assert main(["bench", "--summarise", str(runs), "--out", str(tmp_path / "o")]) == 0
    assert "| w | asgd | 2 | 1 | 0.8000 ± 0.0000 |" in (tmp_path / "o" / "results.md").read_text()
    assert (tmp_path / "o" / "results.png").is_file() and "results.md" in capsys.readouterr().out
