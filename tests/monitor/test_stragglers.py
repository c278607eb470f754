"""Straggler and bottleneck scores on hand-built step-time splits."""

from __future__ import annotations

import pytest

from sparkdp.monitor.stragglers import StragglerDetector

pytestmark = pytest.mark.timeout(30)


def _feed(detector, windows, per_step, hosts=None):
    """``per_step[rank] = (data, compute, comm)`` seconds per step, 10 steps per window."""
    said = []
    totals = {r: [0, 0.0, 0.0, 0.0] for r in per_step}
    for _ in range(windows):
        for rank, (data, compute, comm) in per_step.items():
            t = totals[rank]
            t[0] += 10
            t[1] += 10 * data
            t[2] += 10 * compute
            t[3] += 10 * comm
            said += detector.update(
                {
                    "rank": rank,
                    "steps": t[0],
                    "data_s": t[1],
                    "compute_s": t[2],
                    "comm_s": t[3],
                    **({"host": hosts[rank]} if hosts else {}),
                }
            )
    return said


def test_a_slow_compute_worker_is_named_once_with_its_cause():
    detector = StragglerDetector(2, patience=3)
    # sync training: the fast rank waits for the slow one in its communication
    said = _feed(detector, 6, {0: (0.001, 0.010, 0.030), 1: (0.001, 0.040, 0.001)})
    assert len(said) == 1
    assert said[0].startswith("worker 1 is a straggler") and "slow compute" in said[0]
    assert detector.scores[1]["relative"] == pytest.approx(0.011 / 0.041)
    assert detector.scores[0]["relative"] == 1.0 and detector.scores[1]["individual"] == pytest.approx(1.0)


def test_slow_data_is_told_apart_from_slow_compute():
    said = _feed(StragglerDetector(2, patience=2), 4, {0: (0.001, 0.01, 0.0), 1: (0.05, 0.01, 0.0)})
    assert len(said) == 1 and "worker 1" in said[0] and "slow data" in said[0]


def test_equal_workers_raise_nothing():
    assert _feed(StragglerDetector(3), 10, {r: (0.001, 0.01, 0.002) for r in range(3)}) == []


def test_a_job_communicating_most_of_the_time_is_told_what_to_try():
    said = _feed(StragglerDetector(2, comm_min_s=1.0), 5, {0: (0.0, 0.01, 0.05), 1: (0.0, 0.01, 0.06)})
    assert len(said) == 1 and "communication-bound" in said[0] and "period" in said[0]


def test_an_asynchronous_worker_on_a_slow_link_is_named_with_the_network_as_cause():
    # asgd: worker 1's pushes and pulls take 10x longer (its host's link); both compute alike
    per_step = {0: (0.001, 0.048, 0.300), 1: (0.001, 0.048, 3.000)}
    said = [
        s
        for s in _feed(
            StragglerDetector(2, patience=3, comm_is_own=True), 6, per_step, hosts={0: "node-a", 1: "node-b"}
        )
        if "straggler" in s
    ]
    assert len(said) == 1 and said[0].startswith("worker 1 on host node-b is a straggler"), said
    assert "slow network" in said[0], said
    assert "3000.0 against 300.0 ms per step" in said[0]
    # the same split in a synchronous job is a wait for peers, not the worker's own slowness
    assert not any("straggler" in s for s in _feed(StragglerDetector(2, patience=3), 6, per_step))


def test_a_synchronous_communication_bound_job_says_the_slowest_link_slows_everyone():
    said = _feed(StragglerDetector(2, comm_min_s=1.0), 5, {0: (0.0, 0.05, 0.95), 1: (0.0, 0.05, 0.95)})
    assert len(said) == 1 and "at least 95%" in said[0] and "slowest link" in said[0]
    said = _feed(
        StragglerDetector(2, comm_min_s=1.0, comm_is_own=True),
        5,
        {0: (0.0, 0.05, 0.95), 1: (0.0, 0.05, 0.95)},
    )
    assert len(said) == 1 and "slowest link" not in said[0]
