"""The calibration stage's timings: the step compute at the slowest worker's pace, and
(``sparkdp plan --calibrate --workers-per-host``) hsdp's collectives on the mesh it trains on."""

import time

import pytest
import torch

from sparkdp.driver.calibrate import TINY, Calibration, _hsdp_collectives, _paced_compute_s
from tests.helpers.dist import run_workers

PARAMS = 2_000_000  # 8 MB: a model-sized transfer far above the tiny one's time on loopback


def _timed(collective, per_host):
    torch.manual_seed(collective.rank)
    return _hsdp_collectives(PARAMS, collective, 3, lambda: None, per_host)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_hsdps_collectives_are_timed_within_each_host_and_across():
    out = run_workers(_timed, 4, 2, timeout_s=100)
    keys = {"local_all_gather_tiny", "local_all_gather", "local_reduce_scatter", "replica_allreduce"}
    for rank, times in enumerate(out):
        assert set(times) == keys, rank
        assert all(t > 0 for t in times.values()), (rank, times)
        assert times["local_all_gather"] > times["local_all_gather_tiny"], (rank, times)
    median = {k: sorted(t[k] for t in out)[2] for k in keys}
    cal = Calibration(
        workers=4,
        params=PARAMS,
        batch=64,
        step_compute_s=0.01,
        allreduce_tiny_s=1e-4,
        allreduce_full_s=1e-2,
        ps_tiny_s=1e-4,
        ps_full_s=1e-2,
        per_host=2,
        local_all_gather_tiny_s=median["local_all_gather_tiny"],
        local_all_gather_s=median["local_all_gather"],
        local_reduce_scatter_s=median["local_reduce_scatter"],
        replica_allreduce_s=median["replica_allreduce"],
    )
    net = cal.network()
    # the fitted half ring goes through both all-gather points
    half = (2 - 1) * net.local_latency_s + 1 / 2 * PARAMS * 4 * net.local_seconds_per_byte
    assert half == pytest.approx(median["local_all_gather"], rel=1e-6)
    tiny = (2 - 1) * net.local_latency_s + 1 / 2 * TINY * 4 * net.local_seconds_per_byte
    if net.local_latency_s > 0:  # (a latency fitted below zero is clamped to 0, off the tiny point)
        assert tiny == pytest.approx(median["local_all_gather_tiny"], rel=1e-6)
    assert net.local_reduce_scatter_factor > 0 and net.replica_allreduce_factor > 0


def _two_workers(collective):
    hsdp = [_hsdp_collectives(PARAMS, collective, 3, lambda: None, n) for n in (2, 1, 3, None)]
    pause = 0.02 * (collective.rank + 1)  # rank 1's "steps" take twice rank 0's
    return hsdp, _paced_compute_s(lambda: time.sleep(pause), 5, collective)


@pytest.mark.distributed
@pytest.mark.timeout(60)
def test_compute_goes_at_the_slowest_pace_and_hsdp_needs_two_hosts_or_more():
    (hsdp0, paced0), (hsdp1, paced1) = run_workers(_two_workers, 2, timeout_s=50)
    # 2 workers: one host of 2, or hosts of 1 worker (no shard group), or 3 that do not divide them
    assert hsdp0 == hsdp1 == [{}] * 4
    # a synchronous step waits for the slower worker: both time its 40 ms, not rank 0's 20 ms
    for paced in (paced0, paced1):
        assert 0.040 <= paced < 0.060, paced
