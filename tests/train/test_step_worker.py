"""Per-step fault tolerance's worker side in one process: the driver's real quorum endpoint,
real workers (threads, each with its own copy of the job and its own gloo groups), one worker
lost mid-epoch and a replacement joining. Each epoch's rows are counted as the committed steps
trained them: every row once, across the leave and the join.

Rank-based sharding in place of the row cursor would train the lost worker's share of the
epoch never and the joiner's twice; this test then fails."""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sparkdp import state as state_io
from sparkdp.comm.quorum_group import store_client
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.errors import ProtocolError
from sparkdp.ps.transport.base import ConnectInfo
from sparkdp.strategies import resolve_strategy
from sparkdp.train.faults import Fault
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.row_cursor import RowCursor
from sparkdp.train.step_worker import StepLink, StepTrainer, step_cursor

pytestmark = pytest.mark.timeout(120)

ROWS, BATCH, WORKERS, EPOCHS = 600, 4, 3, 2  # 50 steps an epoch


class Noting(TensorData):
    """In-memory data that notes the rows of the last batch a worker took."""

    last: list[int] = []

    def rows_at(self, take):
        self.last = take.tolist()
        return super().rows_at(take)


class Counting(StepTrainer):
    """A worker that notes, per epoch, the row ids of each step it commits (as its data gave them)."""

    seen: dict[int, Counter[int]]

    def compute(self, group, decision):
        self.spec.train.last = []
        self.computing = self.step
        return super().compute(group, decision)

    def settle(self, commit):
        if commit and self.pending is not None:
            epoch = self.cursor.epoch_of(self.computing)
            self.seen.setdefault(epoch, Counter()).update(self.spec.train.last)
        return super().settle(commit)


def _spec() -> FitSpec:
    ids = torch.arange(ROWS, dtype=torch.float32)
    torch.manual_seed(0)
    return FitSpec(
        model=nn.Linear(1, 2),
        loss=nn.functional.cross_entropy,
        optimizer=optimizer_factory("sgd", None, lr=0.01),
        strategy=resolve_strategy("allreduce"),
        train=Noting(ids[:, None] / ROWS, (ids % 2).long()),
        eval=None,
        training=TrainingConfig(epochs=EPOCHS, batch_size=BATCH, seed=3),
    )


def _worker(spec, link, slot, joining, fault, seen, outcome) -> None:
    trainer = Counting(copy.deepcopy(spec), link, slot, fault)
    trainer.seen = seen
    client = QuorumClient(link.quorum, slot, wait_s=30.0)
    try:
        store = store_client(link.store[0], link.store[1], 30.0)
        outcome[slot] = trainer.run(client, store, joining)
        client.close()
    except RuntimeError as exc:  # the injected failure: the driver sees the connection close
        client.abandon()
        outcome[slot] = exc


def test_each_epochs_rows_are_trained_once_across_a_leave_and_a_join() -> None:
    spec = _spec()
    quorum = Quorum(WORKERS, step_cursor(spec, WORKERS).total_steps)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    seen: dict[int, dict[int, Counter[int]]] = {w: {} for w in range(WORKERS)}
    replacement: dict[int, Counter[int]] = {}
    outcome: dict[int, object] = {}
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        link = StepLink(server.info, ("127.0.0.1", store.port), WORKERS, 1, 30.0, 30.0)
        faults = {1: Fault("raise", 1, 20), 0: Fault("slow", 0, 1, delay_ms=15)}  # 20 of 50 steps an epoch
        threads = [
            threading.Thread(target=_worker, args=(spec, link, w, False, faults.get(w), seen[w], outcome))
            for w in range(WORKERS)
        ]
        for t in threads:
            t.start()
        threads[1].join(60)
        assert isinstance(outcome[1], RuntimeError)
        while quorum.step < 25 and threads[0].is_alive():  # the survivors alone for a few steps first
            time.sleep(0.01)
        joiner = threading.Thread(target=_worker, args=(spec, link, 1, True, None, replacement, outcome))
        joiner.start()
        for t in (threads[0], threads[2], joiner):
            t.join(60)
    kinds = [(r["worker"], r["kind"]) for r in quorum.records]
    assert kinds == [(1, "leave"), (1, "join")]
    assert quorum.records[0]["step"] == 19 and 25 <= quorum.records[1]["step"] < 2 * 50 - 1
    # every epoch: each row exactly once over all workers' committed steps, the lost one's included
    for epoch in range(EPOCHS):
        total = Counter()
        for counts in (*seen.values(), replacement):
            total.update(counts.get(epoch, Counter()))
        assert total == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
    reports = [r for r in outcome.values() if r is not None and not isinstance(r, Exception)]
    assert len(reports) == 1 and [h["samples"] for h in reports[0].history] == [ROWS, ROWS]


def test_a_step_splits_its_rows_between_the_workers_of_its_quorum() -> None:
    cursor = RowCursor(rows=10, global_batch=4, epochs=2, shuffle=False)
    assert cursor.steps_per_epoch == 3 and cursor.total_steps == 6
    assert cursor.step_rows(2).tolist() == [8, 9]  # the epoch's last step: the rows left, none repeated
    assert [cursor.my_rows(1, r, 3).tolist() for r in range(3)] == [[4, 5], [6], [7]]
    assert cursor.my_rows(4, 0, 1).tolist() == [4, 5, 6, 7] and cursor.epoch_of(4) == 1
    shuffled = RowCursor(rows=10, global_batch=4, epochs=1, seed=1)
    assert sorted(torch.cat([shuffled.step_rows(s) for s in range(3)]).tolist()) == list(range(10))


def test_a_healers_state_for_another_model_is_refused_before_anything_loads() -> None:
    spec = _spec()
    link = StepLink(ConnectInfo("127.0.0.1:1", b"s" * 32), ("127.0.0.1", 1), WORKERS, 1, 30.0, 30.0)
    trainer = StepTrainer(spec, link, 0, None)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    other = state_io.to_bytes({"model": {"weight": torch.zeros(3, 1), "bias": torch.zeros(3)}})
    with pytest.raises(ProtocolError, match="does not match this worker's model"):
        trainer.load(other)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
