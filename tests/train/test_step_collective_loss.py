"""A lost worker's collective frees every survivor soon, not after ``pg_timeout_s``: in a ring
of four, only the lost worker's neighbours see its sockets close; the survivor opposite it waits
on them, so they must leave their broken group at once rather than hold it to the boundary."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from sparkdp.comm.quorum_group import QuorumGroup, store_client
from sparkdp.train.step_worker import StepTrainer

pytestmark = pytest.mark.timeout(90)

WORLD, LOST, TIMEOUT_S = 4, 1, 30.0


def test_every_survivor_of_a_lost_worker_fails_its_collective_within_seconds() -> None:
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    groups = [None] * WORLD
    formed = threading.Barrier(WORLD)

    def form(rank: int) -> QuorumGroup:
        groups[rank] = QuorumGroup(store_client("127.0.0.1", master.port, 30.0), 7, rank, WORLD, TIMEOUT_S)
        formed.wait()
        return groups[rank]

    def survive(rank: int) -> float:
        """The survivor's steps until one fails: the seconds from the loss to that failure."""
        group, trainer = form(rank), SimpleNamespace(worker=rank, step=0)
        while StepTrainer.reduce(trainer, group, [torch.ones(100_000)]):  # type: ignore[arg-type]
            pass
        return time.monotonic() - lost_at[0]

    lost_at = [float("inf")]
    with ThreadPoolExecutor(WORLD) as pool:
        survivors = [pool.submit(survive, r) for r in range(WORLD) if r != LOST]
        lost = form(LOST)
        lost_at[0] = time.monotonic()
        lost.teardown()  # its sockets close as a killed process's would (a second later)
        seconds = [f.result(timeout=2 * TIMEOUT_S) for f in survivors]
    for group in groups:
        group.teardown()
    # released a second after the loss, each hop of the ring a second more: far below TIMEOUT_S
    assert max(seconds) < 8.0, seconds
