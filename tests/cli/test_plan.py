"""``sparkdp plan``: predictions from stated figures, and calibration on a real local Spark cluster."""

from __future__ import annotations

import json

import pytest

from sparkdp.cli.main import main


def test_plan_json_from_stated_figures(capsys):
    assert (
        main(
            [
                "plan",
                "--model",
                "cnn",
                "--step-compute-ms",
                "70",
                "--workers",
                "16",
                "--bandwidth",
                "10",
                "--latency",
                "0",
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["params"] == 3_274_634 and report["step_compute_s"] == pytest.approx(0.070)
    rows = {(r["label"], r["workers"]): r for r in report["predictions"]}
    assert {w for _, w in rows} == {1, 2, 4, 8, 16}
    assert rows[("allreduce", 2)]["step_s"] == pytest.approx(0.070 + 3_274_634 * 4 * 0.8e-9, rel=1e-6)
    assert rows[("asgd(k=1,shards=1)", 16)]["bound"] == "server"
    # allreduce keeps 78 % < 80 % at 16; diloco's one int8 model per 32 steps costs 0.1 ms a step
    assert report["recommendation"].startswith("diloco(H=32,int8): 1.26x")
    assert rows[("diloco(H=32,int8)", 16)]["step_s"] == pytest.approx(
        0.070 + (15 * (3_274_634 + 3_274_634 * 4 / 1024) * 0.8e-9 + 2 * 15 * 8 / 16 * 0.8e-9) / 32, rel=1e-6
    )


def test_plan_table_and_errors(capsys):
    assert main(["plan", "--params", "1000000", "--step-compute-ms", "5", "--workers", "4"]) == 0
    out = capsys.readouterr().out
    assert "predicted step time" in out and "recommendation:" in out and "(k=8)" in out and "(bf16)" in out
    assert main(["plan", "--model", "cnn"]) == 2
    assert "give --step-compute-ms" in capsys.readouterr().err
    assert main(["plan", "--step-compute-ms", "5"]) == 2
    assert "give --model NAME" in capsys.readouterr().err
    assert main(["plan", "--params", "10", "--step-compute-ms", "5", "--verify"]) == 2
    assert "needs --calibrate" in capsys.readouterr().err
    assert main(["plan", "--model", "nope", "--step-compute-ms", "5"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.spark
def test_calibration_measures_every_term(spark):
    from sparkdp.driver.calibrate import calibrate
    from sparkdp.models import build_model

    # 13 MB over gloo, as between machines: the transfer dominates the ranks' skew (through the
    # same-host shared-memory reducer it takes ~5 ms, and a loaded machine's skew once exceeded it).
    # Each timing follows a compute step, so it carries that step's skew between the ranks; on
    # loopback the transfer is about the size of that skew, and a median of 3 once put the tiny
    # message above the full one: 7 repetitions keep the medians apart.
    cal = calibrate(build_model("cnn"), spark=spark, workers=2, reps=7, batch=16, shared_memory=False)
    net = cal.network()
    assert cal.params == 3_274_634
    assert 0 < cal.step_compute_s < 1.0
    # a model-sized transfer takes longer than a tiny one, and the fitted terms are positive
    assert cal.allreduce_full_s > cal.allreduce_tiny_s > 0 and cal.ps_full_s > cal.ps_tiny_s > 0
    assert net.latency_s >= 0 and net.seconds_per_byte > 0 and net.ps_beta > 0
    assert cal.server_apply_s > 0 and net.server_seconds_per_byte == cal.server_apply_s / (cal.params * 4)
    # the fit reproduces the two measured points it came from
    from sparkdp.costmodel import ring_allreduce_s

    assert ring_allreduce_s(cal.params * 4, 2, net) == pytest.approx(cal.allreduce_full_s, rel=1e-6)
    assert 2 * net.ps_alpha + 2 * cal.params * 4 * net.ps_beta == pytest.approx(cal.ps_full_s, rel=1e-6)
    # two pushes at once through the server's link: its shared rate, never faster than one flow's
    assert cal.ps_shared_s > 0 and net.ps_link_beta == pytest.approx(
        max(cal.ps_shared_s / (2 * cal.params * 4), net.ps_beta), rel=1e-9
    )
    # two workers cycling through the server: a round is at least one worker's compute and exchange,
    # and the bunching read from it is a fraction of the link's busy time
    assert cal.ps_rounds_s > cal.step_compute_s / 2 and 0.0 <= net.ps_bunching <= 1.0
    # the sharded strategies' all-gather and reduce-scatter, timed on torch.distributed's group: each
    # factor is the measured time over the half ring the fitted α, β price
    from sparkdp.costmodel import half_ring_s

    assert cal.all_gather_s > 0 and cal.reduce_scatter_s > 0
    half = half_ring_s(cal.params * 4, 2, net)
    assert net.all_gather_factor == pytest.approx(cal.all_gather_s / half, rel=1e-9)
    assert net.reduce_scatter_factor == pytest.approx(cal.reduce_scatter_s / half, rel=1e-9)
    # zero1's broadcast of its partitions, over the same half ring
    assert cal.partition_broadcast_s > 0
    assert net.broadcast_factor == pytest.approx(cal.partition_broadcast_s / half, rel=1e-9)


def test_plan_says_which_strategies_fit_the_memory_per_worker(capsys):
    # 1,000,000 float32 parameters with AdamW: 16 MB per replica, 10 MB under zero1 at 4 workers,
    # 4 MB under fsdp; 6 MB per worker fits fsdp alone
    argv = ["plan", "--params", "1000000", "--step-compute-ms", "50", "--workers", "4"]
    assert main([*argv, "--memory-per-worker", "6MB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    at4 = {r["label"]: r for r in report["predictions"] if r["workers"] == 4}
    assert at4["allreduce"]["state_bytes"] == 16_000_000 and at4["allreduce"]["fits"] is False
    assert at4["zero1"]["state_bytes"] == 10_000_000 and at4["zero1"]["fits"] is False
    assert at4["fsdp"]["state_bytes"] == 4_000_000 and at4["fsdp"]["fits"] is True
    assert report["memory_per_worker"] == 6_000_000 and "not counted" in report["activations"]
    assert report["recommendation"].startswith("fsdp: allreduce's model state")
    assert main([*argv, "--memory-per-worker", "6MB", "--workers-per-host", "2"]) == 0
    out = capsys.readouterr().out
    assert "fits 5.72 MiB" in out and "activations are not counted" in out
    table = {
        line.split()[1]: line.split()[-2]
        for line in out.splitlines()
        if line.startswith("│ ") and "MiB" in line
    }
    assert table["allreduce"] == "no" and table["fsdp"] == "yes" and table["hsdp(L=2)"] == "no"
    assert main([*argv, "--memory-per-worker", "lots"]) == 2
    assert "a memory size is a positive number" in capsys.readouterr().err
