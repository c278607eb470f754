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
from sparkdp.train.row_cursor import RowCursor, epoch_order
from sparkdp.train.step_diloco import DiLoCoRounds
from sparkdp.train.step_worker import StepLink, StepTrainer

pytestmark = pytest.mark.timeout(120)

ROWS, BATCH, WORKERS, EPOCHS = 600, 4, 3, 2  # 50 steps an epoch


class Noting(TensorData):
    """In-memory data that notes the rows the worker took since ``last`` was emptied."""

    last: list[int] = []

    def rows_at(self, take):
        self.last = [*self.last, *take.tolist()]
        return super().rows_at(take)


TRAINERS = {"allreduce": StepTrainer, "diloco": DiLoCoRounds}


def counting(base: type[StepTrainer]) -> type[StepTrainer]:
    """``base``, noting per epoch the row ids of each step it commits (as its data gave them)."""

    class Counting(base):  # type: ignore[valid-type, misc]
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

    return Counting


def _spec(strategy: str = "allreduce", rows: int = ROWS, **options) -> FitSpec:
    ids = torch.arange(rows, dtype=torch.float32)
    torch.manual_seed(0)
    return FitSpec(
        model=nn.Linear(1, 2),
        loss=nn.functional.cross_entropy,
        optimizer=optimizer_factory("sgd", None, lr=0.01),
        strategy=resolve_strategy(strategy, **options),
        train=Noting(ids[:, None] / rows, (ids % 2).long()),
        eval=None,
        training=TrainingConfig(epochs=EPOCHS, batch_size=BATCH, seed=3),
    )


class DiesWhileHealing(StepTrainer):
    """A worker whose process is lost as it starts to heal a joiner."""

    def state_bytes(self, epoch_ends):
        raise RuntimeError("lost while healing")


def _worker(spec, link, slot, joining, fault, seen, outcome, base=None) -> None:
    """Run one worker thread; its result or failure goes to ``outcome[(slot, joining)]``, so a
    replacement's never overwrites (nor is overwritten by) the slot's first worker's."""
    trainer = counting(base or TRAINERS[spec.strategy.name])(copy.deepcopy(spec), link, slot, fault)
    trainer.seen = seen
    client = QuorumClient(link.quorum, slot, wait_s=30.0)
    try:
        store = store_client(link.store[0], link.store[1], 30.0)
        outcome[(slot, joining)] = trainer.run(client, store, joining)
        client.close()
    except (RuntimeError, ConnectionError) as exc:  # a failure: the driver sees the connection close
        client.abandon()
        outcome[(slot, joining)] = exc


def leave_and_join(spec: FitSpec, strategy: str):
    """Three workers; worker 1 fails at its tenth step of epoch 1 (worker 0 slowed a little), the
    other two go on alone for a few steps, then worker 1's replacement joins. Returns the quorum,
    the job's steps, each first worker's rows per epoch, the replacement's, and every outcome."""
    total = TRAINERS[strategy].cursor_for(spec, WORKERS).total_steps
    quorum = Quorum(WORKERS, total)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    seen: dict[int, dict[int, Counter[int]]] = {w: {} for w in range(WORKERS)}
    replacement: dict[int, Counter[int]] = {}
    outcome: dict[tuple[int, bool], object] = {}
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        link = StepLink(server.info, ("127.0.0.1", store.port), WORKERS, 1, 30.0, 30.0)
        faults = {1: Fault("raise", 1, 10), 0: Fault("slow", 0, 1, delay_ms=15)}  # in epoch 1
        threads = [
            threading.Thread(target=_worker, args=(spec, link, w, False, faults.get(w), seen[w], outcome))
            for w in range(WORKERS)
        ]
        for t in threads:
            t.start()
        threads[1].join(60)
        assert isinstance(outcome[(1, False)], RuntimeError)
        while quorum.step < 14 and threads[0].is_alive():  # the survivors alone for a few steps first
            time.sleep(0.01)
        joiner = threading.Thread(target=_worker, args=(spec, link, 1, True, None, replacement, outcome))
        joiner.start()
        for t in (threads[0], threads[2], joiner):
            t.join(60)
    return quorum, total, seen, replacement, outcome


@pytest.mark.parametrize(("strategy", "options"), [("allreduce", {}), ("diloco", {"period": 2})])
def test_each_epochs_rows_are_trained_once_across_a_leave_and_a_join(strategy, options) -> None:
    quorum, total, seen, replacement, outcome = leave_and_join(_spec(strategy, **options), strategy)
    kinds = [(r["worker"], r["kind"]) for r in quorum.records]
    assert kinds == [(1, "leave"), (1, "join")]
    assert quorum.records[0]["step"] == 9 and 14 <= quorum.records[1]["step"] < total - 1
    # every epoch: each row exactly once over all workers' committed steps, the lost one's included
    for epoch in range(EPOCHS):
        counted = Counter()
        for counts in (*seen.values(), replacement):
            counted.update(counts.get(epoch, Counter()))
        assert counted == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
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


def _run_quorum(spec: FitSpec, workers: int) -> dict[tuple[int, bool], object]:
    """Every worker's outcome of ``spec`` on ``workers`` threads, with no failure."""
    total = TRAINERS[spec.strategy.name].cursor_for(spec, workers).total_steps
    quorum = Quorum(workers, total)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    outcome: dict[tuple[int, bool], object] = {}
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        link = StepLink(server.info, ("127.0.0.1", store.port), workers, 1, 30.0, 30.0)
        threads = [
            threading.Thread(target=_worker, args=(spec, link, w, False, None, {}, outcome))
            for w in range(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return outcome


def test_diloco_rounds_are_diloco_with_the_workers_weighted_by_rows() -> None:
    """Two workers against a hand-written DiLoCo: torch.optim inner SGD on each worker's rows of a
    round, the outer Nesterov SGD on the row-weighted mean change."""
    period, workers, rows = 3, 2, 601  # 25 rounds of 24 rows an epoch, then one of a single row
    spec = _spec("diloco", rows, period=period)
    [report] = [r for r in _run_quorum(spec, workers).values() if r is not None]
    cursor = DiLoCoRounds.cursor_for(spec, workers)
    start = copy.deepcopy(spec.model)
    outer_params = [p.detach().clone() for p in start.parameters()]
    outer = torch.optim.SGD(outer_params, lr=0.7, momentum=0.9, nesterov=True)
    replicas = [copy.deepcopy(start) for _ in range(workers)]
    inner = [spec.optimizer.build(m) for m in replicas]
    for step in range(cursor.total_steps):
        order = epoch_order(rows, cursor.epoch_of(step), 3, True)
        total = len(cursor.step_rows(step, order))
        change = [torch.zeros_like(p) for p in outer_params]
        for w in range(workers):
            mine = cursor.my_rows(step, w, workers, order)
            for chunk in (c for c in torch.tensor_split(mine, period) if len(c)):  # a short round's
                x, y = spec.train.rows_at(chunk)
                inner[w].zero_grad()
                nn.functional.cross_entropy(replicas[w](x), y).backward()
                inner[w].step()
            for c, g, p in zip(change, outer_params, replicas[w].parameters(), strict=True):
                c += (g - p.detach()) * (len(mine) / total)
        for g, c in zip(outer_params, change, strict=True):
            g.grad = c
        outer.step()
        for replica in replicas:
            with torch.no_grad():
                for p, g in zip(replica.parameters(), outer_params, strict=True):
                    p.copy_(g)
    trained = state_io.state_from_bytes(report.state)
    for name, expected in replicas[0].state_dict().items():
        torch.testing.assert_close(trained[name], expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(trained["weight"], start.weight)  # (it trained)


def test_a_healer_lost_while_healing_costs_its_joiner_the_join_and_the_rest_go_on() -> None:
    """Worker 1 lost; its replacement is to heal from worker 0, which is lost as it starts; the
    replacement is dropped too, worker 2 goes on alone once its group times out forming, and a
    second replacement heals from worker 2. Each epoch's rows are still trained once."""
    spec = _spec()
    quorum = Quorum(WORKERS, TRAINERS["allreduce"].cursor_for(spec, WORKERS).total_steps)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    seen: list[dict[int, Counter[int]]] = [{} for _ in range(5)]
    outcome: dict[tuple[int, bool], object] = {}
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        link = StepLink(server.info, ("127.0.0.1", store.port), WORKERS, 1, 3.0, 30.0)
        slow = Fault("slow", 2, 1, delay_ms=15)
        start = [
            (0, None, DiesWhileHealing),
            (1, Fault("raise", 1, 10), None),
            (2, slow, None),
        ]
        threads = [
            threading.Thread(target=_worker, args=(spec, link, w, False, f, seen[w], outcome, b))
            for w, f, b in start
        ]
        for t in threads:
            t.start()
        threads[1].join(60)
        while quorum.step < 14 and threads[2].is_alive():
            time.sleep(0.01)
        orphan = threading.Thread(target=_worker, args=(spec, link, 1, True, None, seen[3], outcome))
        orphan.start()
        for t in (threads[0], orphan):
            t.join(60)
            assert not t.is_alive(), f"{t.name} still runs after 60 s"
        assert isinstance(outcome[(0, False)], RuntimeError), outcome
        assert isinstance(outcome[(1, True)], ConnectionError), outcome
        joiner = threading.Thread(target=_worker, args=(spec, link, 1, True, None, seen[4], outcome))
        joiner.start()
        for t in (threads[2], joiner):
            t.join(60)
    kinds = [(r["worker"], r["kind"], r.get("healed_from")) for r in quorum.records]
    assert kinds == [
        (1, "leave", None),
        (1, "join", 0),
        (0, "leave", None),
        (1, "leave", None),
        (1, "join", 2),
    ]
    assert quorum.records[1]["heal_s"] is None and quorum.records[4]["heal_s"] > 0
    for epoch in range(EPOCHS):
        counted = Counter()
        for counts in seen:
            counted.update(counts.get(epoch, Counter()))
        assert counted == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
