"""costmodel.py's sharded strategies (fsdp, hsdp, zero1) and model state per worker, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from sparkdp import costmodel
from sparkdp.costmodel import Network, Workload, predict, state_bytes
from sparkdp.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

P = 1_000_000  # parameters: 4 MB of float32
SMALL = Workload(params=P, step_compute_s=0.050)
TEN_GBIT = Network.from_link(10.0, 0.0)  # β = 0.8 ns per byte, no latency
BETA = 0.8e-9


def test_model_state_per_worker_by_hand():
    # parameters 4 MB + gradients 4 MB + AdamW's two moments 8 MB = 16 MB per replica
    assert state_bytes("allreduce", SMALL, 4) == 16_000_000
    assert state_bytes("average", SMALL, 4) == 16_000_000
    assert state_bytes("diloco", SMALL, 4) == 24_000_000  # + its anchor and outer momentum
    assert state_bytes("fsdp", SMALL, 4) == 4_000_000  # all three split 4 ways
    assert state_bytes("zero1", SMALL, 4) == 4_000_000 + 4_000_000 + 2_000_000  # optimizer / 4
    assert state_bytes("hsdp", SMALL, 4, per_host=2) == 8_000_000  # split over a host's 2
    sgd = Workload(params=P, step_compute_s=0.050, optimizer_states=0)
    assert state_bytes("allreduce", sgd, 4) == 8_000_000 and state_bytes("fsdp", sgd, 4) == 2_000_000
    assert state_bytes("fsdp", SMALL, 3) == 5_333_334  # rounded up: a rank holds the odd byte


def test_fsdp_moves_one_and_a_half_all_reduces():
    s = SMALL.nbytes
    # all-gather (forward) + all-gather (backward) + reduce-scatter: 3 x (M-1)/M·S·β
    fsdp = predict("fsdp", SMALL, TEN_GBIT, 4)
    assert fsdp.comm_s == pytest.approx(3 * 3 / 4 * s * BETA)  # 7.2 ms
    assert fsdp.comm_s == pytest.approx(1.5 * predict("allreduce", SMALL, TEN_GBIT, 4).comm_s)
    assert fsdp.step_s == pytest.approx(0.050 + 0.0072)
    # parameters kept from forward to backward: one gather fewer, all-reduce's bytes
    kept = predict("fsdp", SMALL, TEN_GBIT, 4, reshard_after_forward=False)
    assert (
        kept.comm_s == pytest.approx(2 * 3 / 4 * s * BETA)
        and kept.label == "fsdp(reshard_after_forward=False)"
    )
    # each of the three collectives pays (M-1) latencies
    slow = Network.from_link(10.0, 1.0)
    assert predict("fsdp", SMALL, slow, 4).comm_s == pytest.approx(0.0072 + 3 * 3 * 0.001)
    # overlapped like allreduce: half of it hidden behind the compute
    assert predict("fsdp", SMALL, TEN_GBIT, 4, overlap=0.5).step_s == pytest.approx(0.050 + 0.0036)
    assert predict("fsdp", SMALL, TEN_GBIT, 1).comm_s == 0.0


def test_zero1_and_hsdp_by_hand():
    s = SMALL.nbytes
    # the gradient all-reduce (two half rings) and the partitions broadcast (one): 1.5x all-reduce
    assert predict("zero1", SMALL, TEN_GBIT, 4).comm_s == pytest.approx(3 * 3 / 4 * s * BETA)
    # 4 workers, 2 per host: fsdp's three half rings among 2 on a 40 Gbit/s local link (0.2 ns/B),
    # then each worker's half of the model all-reduced across the 2 hosts at 0.8 ns/B
    net = Network(0.0, BETA, local_latency_s=0.0, local_seconds_per_byte=0.2e-9)
    hsdp = predict("hsdp", SMALL, net, 4, per_host=2)
    local = 3 * 1 / 2 * s * 0.2e-9  # 1.2 ms
    across = 2 * 1 / 2 * (s / 2) * BETA  # 1.6 ms
    assert hsdp.comm_s == pytest.approx(local + across) and hsdp.label == "hsdp(L=2)"
    # one host: no traffic across hosts at all
    assert predict("hsdp", SMALL, net, 2, per_host=2).comm_s == pytest.approx(local)
    with pytest.raises(ConfigError, match="6 workers do not fill hosts of 4"):
        predict("hsdp", SMALL, net, 6, per_host=4)


def test_fits_and_recommendation_refuse_what_does_not_fit():
    tight = Workload(params=P, step_compute_s=0.050, memory_per_worker=5_000_000)
    rows = costmodel.table(tight, TEN_GBIT, [4])
    fits = {r.label: r.fits for r in rows}
    assert fits["allreduce"] is False and fits["zero1"] is False and fits["fsdp"] is True
    # allreduce is faster, but does not fit: fsdp is the one recommended
    assert costmodel.recommend(rows, 4).startswith(
        "fsdp: allreduce's model state (15.3 MiB per worker) does not fit"
    )
    roomy = costmodel.table(SMALL, TEN_GBIT, [4])
    assert all(r.fits is None for r in roomy) and costmodel.recommend(roomy, 4).startswith("allreduce")
    nothing = Workload(params=P, step_compute_s=0.050, memory_per_worker=1_000_000)
    assert costmodel.recommend(costmodel.table(nothing, TEN_GBIT, [4]), 4).startswith(
        "none: no strategy's model state fits the memory per worker at 4 workers; the least is fsdp's 3.81 MiB"
    )


def test_memory_sizes_are_read_with_their_units():
    assert costmodel.parse_size("2GiB") == 2 * 1024**3
    assert costmodel.parse_size("1.5 GB") == 1_500_000_000
    assert costmodel.parse_size("512mib") == 512 * 1024**2 and costmodel.parse_size("1000") == 1000
    for bad in ("2 parsecs", "-1GB", "0", "GiB"):
        with pytest.raises(ConfigError, match="a memory size is a positive number"):
            costmodel.parse_size(bad)
    assert costmodel.size_text(16_000_000) == "15.3 MiB" and costmodel.size_text(3 << 30) == "3 GiB"


def _calibrated_on_gloo():
    """Two workers, 4 MB of parameters: a latency-free all-reduce at 1 ns/B (4 ms for the model,
    so a half ring prices an all-gather at 2 ms), and FSDP's process group measured at 5 ms for a
    model-sized all-gather and 7 ms for a reduce-scatter, as gloo's cost more than half a ring."""
    from sparkdp.driver.calibrate import TINY, Calibration

    s = SMALL.nbytes
    return Calibration(
        workers=2,
        params=P,
        batch=64,
        step_compute_s=0.050,
        allreduce_tiny_s=TINY * 4 * 1e-9,
        allreduce_full_s=s * 1e-9,
        ps_tiny_s=2 * TINY * 4 * 1e-9,
        ps_full_s=2 * s * 1e-9,
        all_gather_s=0.005,
        reduce_scatter_s=0.007,
    )


def test_calibrated_collectives_price_the_sharded_strategies():
    net = _calibrated_on_gloo().network()
    assert net.latency_s == pytest.approx(0.0, abs=1e-12) and net.seconds_per_byte == pytest.approx(1e-9)
    assert net.all_gather_factor == pytest.approx(2.5) and net.reduce_scatter_factor == pytest.approx(3.5)
    # fsdp at the calibrated 2 workers: two all-gathers and a reduce-scatter as measured, 17 ms
    # (the ring would say 3 x 2 ms = 6 ms)
    assert predict("fsdp", SMALL, net, 2).comm_s == pytest.approx(2 * 0.005 + 0.007)
    # without resharding one all-gather fewer: 12 ms
    assert predict("fsdp", SMALL, net, 2, reshard_after_forward=False).comm_s == pytest.approx(0.012)
    # at 4 workers each half ring grows to 3/4·S·β = 3 ms, times the factors: (2·2.5 + 3.5)·3 ms
    assert predict("fsdp", SMALL, net, 4).comm_s == pytest.approx(8.5 * 0.003)
    # zero1: the all-reduce (4 ms) and the partitions broadcast, priced as an all-gather (5 ms)
    assert net.broadcast_factor is None
    assert predict("zero1", SMALL, net, 2).comm_s == pytest.approx(0.004 + 0.005)
    # ... unless the broadcast was measured: 3 ms, 1.5 half rings; at 4 workers 1.5 x 3 ms
    timed = dataclasses.replace(_calibrated_on_gloo(), partition_broadcast_s=0.003).network()
    assert timed.broadcast_factor == pytest.approx(1.5)
    assert predict("zero1", SMALL, timed, 2).comm_s == pytest.approx(0.004 + 0.003)
    assert predict("zero1", SMALL, timed, 4).comm_s == pytest.approx(0.006 + 1.5 * 0.003)
    # hsdp, 2 hosts of 2: the factors on the local link's half ring (1/2·S·0.2 ns/B = 0.4 ms),
    # (2·2.5 + 3.5)·0.4 = 3.4 ms, then half of the model all-reduced across the hosts, 2 ms
    local = dataclasses.replace(net, local_latency_s=0.0, local_seconds_per_byte=0.2e-9)
    assert predict("hsdp", SMALL, local, 4, per_host=2).comm_s == pytest.approx(0.0034 + 0.002)
    # allreduce keeps its own price
    assert predict("allreduce", SMALL, net, 2).comm_s == pytest.approx(0.004)


def test_uncalibrated_collectives_are_the_ring():
    net = dataclasses.replace(_calibrated_on_gloo(), all_gather_s=None, reduce_scatter_s=None).network()
    assert (net.all_gather_factor, net.reduce_scatter_factor) == (1.0, 1.0)
    assert predict("fsdp", SMALL, net, 2).comm_s == pytest.approx(3 * 0.002)


def test_plan_prices_fsdp_from_the_calibration(monkeypatch, capsys):
    import json

    import sparkdp
    from sparkdp.cli.main import main
    from sparkdp.driver import calibrate

    # plan --calibrate with the measurements stubbed: no Spark, the hand-worked figures above
    monkeypatch.setattr(sparkdp, "session", lambda *args, **kwargs: None)
    monkeypatch.setattr(calibrate, "calibrate", lambda model, **kwargs: _calibrated_on_gloo())
    argv = ["plan", "--params", str(P), "--model", "cnn", "--calibrate", "--calibration-workers", "2"]
    assert main([*argv, "--workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["network"]["all_gather_factor"] == pytest.approx(2.5)
    assert report["calibration"]["reduce_scatter_factor"] == pytest.approx(3.5)
    rows = {r["label"]: r for r in report["predictions"] if r["workers"] == 2}
    assert rows["fsdp"]["step_s"] == pytest.approx(0.050 + 0.017)
    assert rows["zero1"]["step_s"] == pytest.approx(0.050 + 0.009)
    assert main([*argv, "--workers", "2"]) == 0
    assert "all-gather 2.50x and reduce-scatter 3.50x" in " ".join(capsys.readouterr().out.split())


def _calibrated_hsdp():
    """Four workers as 2 hosts of 2, 4 MB of parameters. The all-reduce over all four: latency-free
    at 1 ns/B (1.5·S·β = 6 ms); all-gather and reduce-scatter on the default group 2.5 and 3.5 half
    rings (3/4·S·β = 3 ms). Within a host, a link of 50 µs and 0.5 ns/B: a 1 KB all-gather takes
    α + 1/2·1024·β = 50.256 µs, a model-sized one α + 1/2·S·β = 1.05 ms, and the reduce-scatter
    3.15 ms (3 of those half rings). Across the hosts, each worker's 2 MB all-reduced in 5 ms where
    the ring on the fitted link says 2·1/2·2 MB·β = 2 ms (2.5 rings)."""
    from sparkdp.driver.calibrate import TINY, Calibration

    s = SMALL.nbytes
    return Calibration(
        workers=4,
        params=P,
        batch=64,
        step_compute_s=0.050,
        allreduce_tiny_s=1.5 * TINY * 4 * 1e-9,
        allreduce_full_s=1.5 * s * 1e-9,
        ps_tiny_s=2 * TINY * 4 * 1e-9,
        ps_full_s=2 * s * 1e-9,
        all_gather_s=0.0075,
        reduce_scatter_s=0.0105,
        per_host=2,
        local_all_gather_tiny_s=50e-6 + 0.5 * TINY * 4 * 0.5e-9,
        local_all_gather_s=50e-6 + 0.5 * s * 0.5e-9,
        local_reduce_scatter_s=3 * (50e-6 + 0.5 * s * 0.5e-9),
        replica_allreduce_s=0.005,
    )


def test_hsdp_is_priced_from_its_own_collectives_within_and_across_hosts():
    net = _calibrated_hsdp().network()
    # the local link is fitted from the two all-gathers, as the network's is from two all-reduces
    assert net.local_latency_s == pytest.approx(50e-6) and net.local_seconds_per_byte == pytest.approx(0.5e-9)
    assert net.local_all_gather_factor == 1.0 and net.local_reduce_scatter_factor == pytest.approx(3.0)
    assert net.replica_allreduce_factor == pytest.approx(2.5)
    # the default group's factors stay fsdp's
    assert (net.all_gather_factor, net.reduce_scatter_factor) == (pytest.approx(2.5), pytest.approx(3.5))
    # hsdp at the calibrated 4: two local all-gathers and the reduce-scatter as measured
    # (2·1.05 + 3.15 ms), then the measured 5 ms across the hosts
    assert predict("hsdp", SMALL, net, 4, per_host=2).comm_s == pytest.approx(0.0021 + 0.00315 + 0.005)
    # 4 hosts of 2: the same within a host; across, 2.5 rings of 2 MB over 4: 2.5·(2·3/4·2 MB·β)
    assert predict("hsdp", SMALL, net, 8, per_host=2).comm_s == pytest.approx(0.00525 + 2.5 * 0.003)
    # fsdp keeps the default group's price: (2·2.5 + 3.5)·3 ms
    assert predict("fsdp", SMALL, net, 4).comm_s == pytest.approx(8.5 * 0.003)
    # without hsdp's measurements none of this is set: the network's factors serve the local link
    bare = dataclasses.replace(_calibrated_hsdp(), replica_allreduce_s=None).network()
    assert bare.local_seconds_per_byte is None and bare.replica_allreduce_factor == 1.0
    assert bare.local().reduce_scatter_factor == pytest.approx(3.5)


def test_plan_takes_the_measured_local_link_unless_one_is_given(monkeypatch, capsys):
    import json

    import sparkdp
    from sparkdp.cli.main import main
    from sparkdp.driver import calibrate

    asked = {}

    def measured(model, **kwargs):
        asked.update(kwargs)
        return _calibrated_hsdp()

    monkeypatch.setattr(sparkdp, "session", lambda *args, **kwargs: None)
    monkeypatch.setattr(calibrate, "calibrate", measured)
    argv = ["plan", "--params", str(P), "--model", "cnn", "--calibrate", "--calibration-workers", "4"]
    argv += ["--workers", "4", "--workers-per-host", "2"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert asked["per_host"] == 2 and asked["workers"] == 4  # calibration measures hsdp's mesh
    assert report["network"]["local_seconds_per_byte"] == pytest.approx(0.5e-9)
    assert report["calibration"]["replica_allreduce_factor"] == pytest.approx(2.5)
    rows = {r["label"]: r for r in report["predictions"] if r["workers"] == 4}
    assert rows["hsdp(L=2)"]["step_s"] == pytest.approx(0.050 + 0.01025)
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "within a host (measured) α 50 µs, 16.00 Gbit/s, reduce-scatter 3.00x" in out
    # a link given replaces the measured one, and the local factors measured against it
    assert main([*argv, "--local-bandwidth", "40", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["network"]["local_seconds_per_byte"] == pytest.approx(0.2e-9)
    assert report["network"]["local_reduce_scatter_factor"] is None
    assert report["network"]["local_latency_s"] == pytest.approx(0.01e-3)  # the default latency
