"""costmodel.py: the cost model against hand-worked numbers (docs/algorithms.md §8's example)."""

from __future__ import annotations

import dataclasses

import pytest

from sparkdp import costmodel
from sparkdp.costmodel import Network, Workload, predict

CNN = Workload(params=3_274_634, step_compute_s=0.070)  # 13.1 MB of float32
TEN_GBIT = Network.from_link(10.0, 0.0)  # β = 0.8 ns per byte, no latency


def test_ring_allreduce_matches_the_documented_example():
    s = CNN.nbytes
    # M = 2: 2(M-1)/M·S = S bytes -> 13.1 MB at 1.25 GB/s = 10.48 ms
    assert costmodel.ring_allreduce_s(s, 2, TEN_GBIT) == pytest.approx(s * 0.8e-9)
    assert costmodel.ring_allreduce_s(s, 2, TEN_GBIT) == pytest.approx(0.01048, rel=1e-3)
    # M = 8: 2·7/8·S = 22.9 MB -> 18.3 ms; latency adds 2(M-1)α
    assert costmodel.ring_allreduce_s(s, 8, TEN_GBIT) == pytest.approx(0.01834, rel=1e-3)
    slow = Network.from_link(10.0, 1.0)
    assert costmodel.ring_allreduce_s(s, 8, slow) - costmodel.ring_allreduce_s(
        s, 8, TEN_GBIT
    ) == pytest.approx(0.014)
    assert costmodel.ring_allreduce_s(s, 1, slow) == 0.0


def test_predictions_per_strategy():
    allreduce = predict("allreduce", CNN, TEN_GBIT, 2)
    assert allreduce.step_s == pytest.approx(0.070 + 0.01048, rel=1e-3)
    assert allreduce.efficiency == pytest.approx(0.070 / allreduce.step_s)
    assert allreduce.samples_per_s == pytest.approx(2 * 64 / allreduce.step_s)
    assert predict("allreduce", CNN, TEN_GBIT, 2, overlap=0.5).step_s == pytest.approx(
        0.070 + 0.00524, rel=1e-3
    )
    assert predict("average", CNN, TEN_GBIT, 2, k=8).step_s == pytest.approx(0.070 + 0.01048 / 8, rel=1e-3)
    # one worker: C + push + pull of S = 70 + 2 × 10.48 ms
    assert predict("asgd", CNN, TEN_GBIT, 1).step_s == pytest.approx(0.070 + 0.02096, rel=1e-3)
    # two: the other worker is in a given queue a fraction 10.48 / 90.96 of the time, with half its
    # transfer left on average -> each transfer waits 10.48 × (1 + 0.1152 / 2) = 11.08 ms
    assert predict("asgd", CNN, TEN_GBIT, 2).step_s == pytest.approx(0.070 + 2 * 0.011084, rel=1e-3)
    # the server's full-duplex link moves M × 13.1 MB each way per round: at M = 8 (83.8 ms) still
    # under a worker's own 91 ms, though queueing adds 16 ms; at M = 16 the link paces everyone
    eight = predict("asgd", CNN, TEN_GBIT, 8)
    assert eight.bound == "compute" and 0.0910 < eight.step_s < 0.12
    asgd = predict("asgd", CNN, TEN_GBIT, 16)
    assert asgd.bound == "server" and asgd.step_s == pytest.approx(16 * CNN.nbytes * 0.8e-9, rel=0.01)
    # 16 shards on links of their own take it back under the worker's own time
    assert predict("asgd", CNN, TEN_GBIT, 16, shards=16).bound == "compute"


def test_parameter_server_round_by_mean_value_analysis():
    # one worker never queues; many saturate the busier direction: M·D per round
    assert costmodel.ps_round_s(0.05, 0.01, 0.02, 1) == pytest.approx(0.08)
    assert costmodel.ps_round_s(0.05, 0.01, 0.02, 100) == pytest.approx(100 * 0.02, rel=1e-3)
    # two workers by hand: X(1) = 1/0.08, Q = U = 0.125 and 0.25 -> waits 0.01·1.0625, 0.02·1.125
    assert costmodel.ps_round_s(0.05, 0.01, 0.02, 2) == pytest.approx(0.05 + 0.010625 + 0.0225)


def test_workers_in_step_stretch_the_server_bound_round():
    # 100 Mbit/s: a model-sized transfer is S·β = 1.048 s. Four workers: the full-duplex link
    # alone gives 4 × 1.048 = 4.19 s per round (mean-value analysis: a little more)
    slow = Network.from_link(0.1, 0.0)
    spread = predict("asgd", CNN, slow, 4)
    assert spread.bound == "server" and spread.step_s == pytest.approx(4 * CNN.nbytes * 80e-9, rel=0.08)
    # b = 0.4: the link's directions idle 40 % of its busy time -> 1.4 × 4.19 = 5.87 s
    bunched = predict("asgd", CNN, dataclasses.replace(slow, ps_bunching=0.4), 4)
    assert bunched.step_s == pytest.approx(1.4 * 4 * CNN.nbytes * 80e-9) and bunched.bound == "server"
    # fully in step (b = 1): every push, then every pull, 8 transfers per round
    assert predict("asgd", CNN, dataclasses.replace(slow, ps_bunching=1.0), 4).step_s == pytest.approx(
        8 * CNN.nbytes * 80e-9
    )
    # one worker has nobody to fall into step with: its own round, C + 2·S·β
    assert predict("asgd", CNN, dataclasses.replace(slow, ps_bunching=1.0), 1).step_s == pytest.approx(
        0.070 + 2 * CNN.nbytes * 80e-9
    )


def test_calibration_derives_the_bunching_from_the_measured_rounds():
    from sparkdp.driver.calibrate import TINY, Calibration

    s = CNN.nbytes
    # a 100 Mbit/s server link with no latency: push+pull of S takes 2.096 s, one of TINY floats
    # 2·TINY·4·80 ns; four workers measured 5.87 s per round, 1.4 × their 4 × 1.048 s on the link
    tiny = 2 * TINY * 4 * 80e-9
    cal = Calibration(
        workers=4,
        params=CNN.params,
        batch=64,
        step_compute_s=0.070,
        allreduce_tiny_s=None,
        allreduce_full_s=None,
        ps_tiny_s=tiny,
        ps_full_s=2 * s * 80e-9,
        ps_shared_s=4 * s * 80e-9,
        ps_rounds_s=1.4 * 4 * s * 80e-9,
    )
    assert cal.network().ps_bunching == pytest.approx(0.4)
    # rounds faster than the link's limit, or not paced by it, say the workers never bunched
    fast = dataclasses.replace(cal, ps_rounds_s=3.0)
    assert fast.network().ps_bunching == 0.0
    paced_by_compute = dataclasses.replace(cal, step_compute_s=20.0, ps_rounds_s=30.0)
    assert paced_by_compute.network().ps_bunching == 0.0
    # and never past the half-duplex bound
    assert dataclasses.replace(cal, ps_rounds_s=100.0).network().ps_bunching == 1.0


def test_worker_counts_table_and_recommendation():
    assert costmodel.worker_counts(1) == [1]
    assert costmodel.worker_counts(8) == [1, 2, 4, 8]
    assert costmodel.worker_counts(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    rows = costmodel.table(CNN, TEN_GBIT, [1, 2, 1024], average_k=8)
    assert [r.label for r in rows[:5]] == [
        "allreduce",
        "allreduce(bf16)",
        "average(k=8)",
        "diloco(H=32,int8)",
        "asgd(k=1,shards=1)",
    ]
    assert costmodel.recommend(rows, 2).startswith("allreduce: 87% scaling efficiency")
    slow = Network.from_link(1.0, 0.5)
    far = costmodel.table(CNN, slow, [1024], average_k=8)
    # int8's all-gather grows with the workers: at 1024 it moves 1023 quarter-models per round
    assert costmodel.recommend(far, 1024).startswith("average(k=8):")
    far = costmodel.table(CNN, slow, [1024], average_k=8, diloco_compression="none")
    assert costmodel.recommend(far, 1024).startswith("diloco(H=32):")  # a ring every 32 steps


def test_compression_and_diloco_by_hand():
    s, beta = CNN.nbytes, 0.8e-9
    # bf16 halves the ring's bytes: M = 2 moves S/2 -> 5.24 ms
    assert predict("allreduce", CNN, TEN_GBIT, 2, compression="bf16").step_s == pytest.approx(
        0.070 + s / 2 * beta
    )
    # int8 at M = 4: an all-gather of 3 × (S/4 + S/1024) bytes
    int8 = predict("average", CNN, TEN_GBIT, 4, k=8, compression="int8")
    assert int8.step_s == pytest.approx(0.070 + 3 * (s / 4 + s / 1024) * beta / 8)
    # diloco H = 32 at M = 2, uncompressed: one ring of S (and 8 bytes of rows) every 32 steps
    plain = predict("diloco", CNN, TEN_GBIT, 2, k=32)
    assert plain.step_s == pytest.approx(0.070 + (s + 8) * beta / 32) and plain.label == "diloco(H=32)"
    # four pieces, each of S/4 = 2.6 ms, hidden behind one 70 ms step apiece: nothing left to pay
    hidden = predict("diloco", CNN, TEN_GBIT, 2, k=32, fragments=4, overlap_steps=1)
    assert hidden.step_s == pytest.approx(0.070) and hidden.options == {
        "H": 32,
        "fragments": 4,
        "overlap_steps": 1,
    }
    # on a 100 Mbit/s link a piece takes 262 ms: one 70 ms step hides only part of it
    slow = Network.from_link(0.1, 0.0)
    part = predict("diloco", CNN, slow, 2, k=32, fragments=4, overlap_steps=1)
    assert part.step_s == pytest.approx(0.070 + 4 * ((s / 4 + 8) * 80e-9 - 0.070) / 32)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: predict("sgd", CNN, TEN_GBIT, 2), "knows allreduce, average, diloco, asgd"),
        (
            lambda: predict("allreduce", CNN, TEN_GBIT, 2, compression="powersgd"),
            "prices allreduce with compression",
        ),
        (lambda: predict("average", CNN, TEN_GBIT, 2, k=0), "k >= 1"),
        (lambda: predict("allreduce", CNN, TEN_GBIT, 0), "workers >= 1"),
        (lambda: Network.from_link(0, 1), "bandwidth must be > 0"),
        (lambda: costmodel.worker_counts(0), "workers must be >= 1"),
    ],
)
def test_bad_input(call, message):
    from sparkdp.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        call()


def test_workers_sharing_one_machines_cores_stretch_the_step():
    shared = Workload(params=CNN.params, step_compute_s=0.070, cpu_slots=2)
    assert predict("allreduce", shared, TEN_GBIT, 2).step_s == predict("allreduce", CNN, TEN_GBIT, 2).step_s
    four = predict("allreduce", shared, TEN_GBIT, 4)
    assert four.step_s == pytest.approx(2 * 0.070 + costmodel.ring_allreduce_s(CNN.nbytes, 4, TEN_GBIT))
    assert four.efficiency == pytest.approx(0.070 / four.step_s)


def test_verification_runs_price_the_synchronisation_at_each_epochs_end():
    from sparkdp.cli.plan_cmd import in_epochs_of

    avg = predict("average", CNN, TEN_GBIT, 2, k=8)  # 70 + 10.48 / 8 ms in long epochs
    # epochs of 10 steps: a sync after step 8 and one at the end -> 2 × 10.48 ms per 10 steps
    assert in_epochs_of(avg, 10) == pytest.approx(0.070 + 2 * 0.01048 / 10, rel=1e-3)
    assert in_epochs_of(avg, 800) == pytest.approx(0.070 + 101 * 0.01048 / 800, rel=1e-3)
    ring = predict("allreduce", CNN, TEN_GBIT, 2)
    assert in_epochs_of(ring, 10) == ring.step_s  # every step synchronises anyway
