"""What one authenticated peer can do to the server is bounded: its worker ids, its sequence
numbers, the size of what it pushes, and a centre that stays finite."""

import math
import time

import pytest
import torch

from sparkdp.errors import ConfigError
from sparkdp.ps import ParameterServer, PushRejected
from sparkdp.rules import RULES
from sparkdp.strategies.async_ps import AsyncParameterServer
from sparkdp.train.children import MAX_CHILDREN, child_worker_id, job_worker_ids
from tests.ps.conftest import Sub, make_ps


def test_only_the_jobs_worker_ids_are_accepted():
    ps = make_ps(worker_ids=4)
    v = ps.pull(3).versions
    assert ps.push(3, 0, v, [torch.ones(3)]).applied
    with pytest.raises(PushRejected, match="worker id 4 is not one of this job's"):
        ps.push(4, 0, v, [torch.ones(3)])
    with pytest.raises(ValueError, match="worker id 2\\*\\*62|worker id 4611686018427387904"):
        ps.pull(2**62)
    assert ps.last_seq(4) == -1 and ps.metrics()["pushes_applied"] == 1
    ps.pull(99, observe=True)  # a look at the centre (the driver's) keeps no books


def test_an_id_outside_the_job_gets_no_dcasgd_backup():
    ps = ParameterServer(
        lambda s: RULES.create("dcasgd", lr=0.1, num_workers=2), [torch.zeros(3)], worker_ids=2
    )
    ps.pull(1)
    with pytest.raises(ValueError, match="not one of this job's"):
        ps.pull(2)
    backups = ps.state_dict()["rules"][0]["backup"]
    assert list(backups) == [1]  # worker 1's only: none was made for id 2


def test_the_job_ids_cover_every_joining_child():
    assert child_worker_id(2, 3, MAX_CHILDREN - 1) == job_worker_ids(3) - 1
    with pytest.raises(ConfigError, match=f"at most {MAX_CHILDREN} processes"):
        child_worker_id(0, 3, MAX_CHILDREN)


def test_a_seq_that_jumps_is_refused_and_the_real_worker_goes_on(caplog):
    ps = make_ps()
    v = ps.pull(0).versions
    assert ps.push(0, 0, v, [torch.ones(3)]).applied
    with pytest.raises(PushRejected, match="seq 4611686018427387904 jumps past 1"):
        ps.push(0, 2**62, v, [torch.full((3,), 100.0)])  # would make the worker's own pushes duplicates
    assert "refused push 4611686018427387904 of worker 0" in caplog.text
    assert ps.last_seq(0) == 0
    assert ps.push(0, 1, v, [torch.ones(3)]).applied  # the real worker's next push still counts
    assert torch.equal(ps.pull(0).tensors[0], torch.full((3,), -2.0))


def test_max_push_norm_bounds_each_push():
    ps = make_ps(max_push_norm=5.0)
    v = ps.pull(0).versions
    assert ps.push(0, 0, v, [torch.tensor([3.0, 4.0, 0.0])]).applied  # norm 5: at the bound
    with pytest.raises(PushRejected, match="L2 norm 5.001 is above max_push_norm 5"):
        ps.push(0, 1, v, [torch.tensor([3.0, 4.0, 0.1])])
    with pytest.raises(PushRejected, match="above max_push_norm"):
        ps.push(0, 1, v, [torch.full((3,), -3e38)])  # its float32 norm overflows: refused too
    assert torch.equal(ps.pull(0).tensors[0], torch.tensor([-3.0, -4.0, 0.0]))
    assert ps.last_seq(0) == 0 and ps.metrics()["rejected"] == 2
    with pytest.raises(ConfigError, match="max_push_norm"):
        make_ps(max_push_norm=math.inf)


def test_a_push_that_would_make_the_centre_non_finite_is_refused():
    ps = make_ps()
    v = ps.pull(0).versions
    big = [torch.full((3,), -3e38)]
    assert ps.push(0, 0, v, big).applied  # centre 3e38: finite
    with pytest.raises(PushRejected, match="would make the centre non-finite"):
        ps.push(0, 1, v, big)  # 6e38 overflows float32
    assert torch.equal(ps.pull(0).tensors[0], torch.full((3,), 3e38))
    assert ps.versions() == [1] and ps.last_seq(0) == 0  # nothing applied, the seq can come again
    assert ps.state_dict()["rules"][0]["applied"] == 1  # the rule's state rolled back with the centre


def test_the_rollback_covers_every_shard():
    ps = make_ps([(3,), (3,)], num_shards=2)
    v = ps.pull(0).versions
    push = [torch.full((3,), -1.0), torch.full((3,), -3e38)]
    assert ps.push(0, 0, v, push).applied
    with pytest.raises(PushRejected, match="non-finite"):
        ps.push(0, 1, v, push)  # shard 0 would be fine, shard 1 overflows
    centre = ps.pull(0).tensors
    assert torch.equal(centre[0], torch.ones(3)) and torch.equal(centre[1], torch.full((3,), 3e38))
    assert ps.versions() == [1, 1]


def test_the_finite_check_costs_little_on_ordinary_pushes():
    """The guard copies nothing for pushes and centres of ordinary magnitude."""
    ps = ParameterServer(lambda s: Sub(lr=1e-3), [torch.zeros(4_000_000)], num_shards=1)
    calls = []
    ps._apply_guarded = lambda *a: calls.append(a)  # type: ignore[method-assign]
    v = ps.pull(0).versions
    started = time.perf_counter()
    for seq in range(5):
        assert ps.push(0, seq, v, [torch.randn(4_000_000)]).applied
    assert not calls and time.perf_counter() - started < 30


def test_the_strategy_passes_its_bound_and_the_jobs_ids_to_the_server():
    from sparkdp.driver.async_job import server_factory

    strategy = AsyncParameterServer("asgd", {"lr": 0.1}, max_push_norm=2.5)
    server = server_factory(strategy, 3)([torch.zeros(2)])
    assert server.max_push_norm == 2.5 and server.worker_ids == job_worker_ids(3)
    assert strategy.options()["max_push_norm"] == 2.5
    with pytest.raises(ConfigError, match="max_push_norm"):
        AsyncParameterServer("asgd", max_push_norm=0)
