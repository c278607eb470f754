"""Processes a worker starts join its job (train.children): the spec they inherit, their ids,
and what a synchronous job tells them (no Spark: a worker context built by hand)."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat

import pytest

from sparkdp.comm.single import IndependentCollective
from sparkdp.errors import ConfigError
from sparkdp.ps.transport.base import ConnectInfo
from sparkdp.strategies import STRATEGIES
from sparkdp.train.children import ENV, child_worker_id, children_join, read_child_spec
from sparkdp.train.context import WorkerContext, set_current

pytestmark = pytest.mark.timeout(60)


def report_context(queue) -> None:  # runs in the started process
    import sparkdp
    from sparkdp.train.context import current

    ctx = current()
    queue.put(
        (
            ctx.rank,
            ctx.world_size,
            ctx.child,
            getattr(ctx.strategy, "worker_id", None),
            sparkdp.is_main_process(),
            os.environ.get(ENV),
        )
    )


def _worker_context(rank: int, world: int) -> WorkerContext:
    """An asynchronous worker's context, its strategy told where the server is (never contacted here)."""
    strategy = STRATEGIES.create("hogwild")
    strategy.connect_to(None, ConnectInfo("127.0.0.1:9", b"s" * 32))
    return WorkerContext(rank, world, IndependentCollective(rank, world), strategy, seed=3)


@pytest.mark.distributed
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_started_processes_inherit_a_private_spec_and_get_ids_of_their_own(method):
    ctx = _worker_context(rank=1, world=2)
    set_current(ctx)
    try:
        with children_join(ctx) as children:
            mp_ctx = mp.get_context(method)
            queue = mp_ctx.Queue()
            processes = [mp_ctx.Process(target=report_context, args=(queue,)) for _ in range(2)]
            for p in processes:
                p.start()
            seen = sorted(queue.get(timeout=30) for _ in processes)
            for p in processes:
                p.join(30)
        assert os.environ.get(ENV) is None  # set only while a process starts
    finally:
        set_current(None)
    # worker 1 of 2: its children are server workers 2 * (k + 1) + 1, none of them "main"
    assert seen == [
        (1, 2, 0, child_worker_id(1, 2, 0), False, None),
        (1, 2, 1, child_worker_id(1, 2, 1), False, None),
    ]
    assert [child_worker_id(1, 2, k) for k in (0, 1)] == [3, 5] and child_worker_id(0, 2, 0) == 2
    assert (children.started, children.joined, children.joinable) == (2, [0, 1], True)


@pytest.mark.distributed
def test_a_synchronous_job_counts_its_processes_but_gives_them_nothing_to_join():
    strategy = STRATEGIES.create("allreduce")
    ctx = WorkerContext(0, 2, IndependentCollective(0, 2), strategy)  # no server to join
    with children_join(ctx) as children:
        queue = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=report_context, args=(queue,))
        p.start()
        rank, world, child, worker_id, main, env = queue.get(timeout=30)
        p.join(30)
    assert (rank, world, child, env) == (0, 1, None, None)  # the process runs alone, as outside a job
    assert (children.started, children.joined, children.joinable) == (1, [], False)


def test_a_spec_another_user_could_read_or_a_broken_one_is_refused(tmp_path):
    spec = tmp_path / "child.json"
    spec.write_text("{}")
    os.chmod(spec, stat.S_IRUSR | stat.S_IWUSR | stat.S_IROTH)
    with pytest.raises(ConfigError, match="is not a child spec this user's sparkdp worker wrote") as info:
        read_child_spec(str(spec))
    assert "cannot be read" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot be read as a sparkdp child spec"):
        read_child_spec(str(tmp_path / "absent.json"))
    os.chmod(spec, stat.S_IRUSR | stat.S_IWUSR)
    with pytest.raises(ConfigError, match="is not a complete sparkdp child spec"):
        read_child_spec(str(spec))
    spec.write_text("[1")
    with pytest.raises(ConfigError, match="cannot be read as a sparkdp child spec"):
        read_child_spec(str(spec))
