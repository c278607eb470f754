"""Per-step fault tolerance for hsdp: the driver's real quorum endpoint in this process, four real
workers in two replica groups of two shards (one process each: FSDP2 needs a process's default
process group), worker 1 lost mid-epoch and replaced.

Worker 1's group-mate (worker 0) leaves the quorum with it and waits; the other group trains every
step's rows alone meanwhile; once the replacement arrives the group heals shard by shard from the
other group and rejoins. The trained parameters are checked against a single-process torch.optim
run of the same steps, every step committed once, and every epoch's row trained once."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard  # noqa: F401  (imported once, before the workers fork)

from sparkdp import state as state_io
from sparkdp.comm.quorum_group import store_client
from sparkdp.config import TrainingConfig
from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.strategies import resolve_strategy
from sparkdp.train.faults import Fault
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.report import WorkerReport
from sparkdp.train.step_hsdp import HSDPSteps
from sparkdp.train.step_worker import StepLink
from tests.train.test_step_worker import Noting, counting

pytestmark = pytest.mark.timeout(240)

ROWS, BATCH, WORKERS, SHARD, EPOCHS = 480, 4, 4, 2, 2  # a global batch of 16: 30 steps an epoch
LR, MOMENTUM = 0.05, 0.9  # momentum: the heal must carry the optimizer's state


class Counting(counting(HSDPSteps)):  # type: ignore[misc]
    """hsdp's worker, noting each step it commits and, per epoch, the row ids it trained in it."""

    committed: list[int]

    def settle(self, commit):
        if commit and self.pending is not None:
            self.committed.append(self.computing)
        return super().settle(commit)


def _spec() -> FitSpec:
    ids = torch.arange(ROWS, dtype=torch.float32)
    features = torch.stack([ids / ROWS, (ids % 3) / 3], dim=1)
    torch.manual_seed(0)
    return FitSpec(
        model=nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2)),
        loss=nn.functional.cross_entropy,
        optimizer=optimizer_factory("sgd", None, lr=LR, momentum=MOMENTUM),
        strategy=resolve_strategy("hsdp", shard_size=SHARD),
        train=Noting(features, (ids % 2).long()),
        eval=None,
        training=TrainingConfig(epochs=EPOCHS, batch_size=BATCH, seed=3),
    )


def _slot(slot: int, fault: Fault | None, setup: Any, out: Any) -> None:
    """One worker's process: it waits for the quorum's address (a replacement: until it is due),
    then puts its outcome (the report, None, or the error) and what it committed."""
    torch.set_num_threads(1)
    info, store_port, joining = setup.get(timeout=120)
    link = StepLink(info, ("127.0.0.1", store_port), WORKERS, 1, 30.0, 120.0)
    trainer = Counting(_spec(), link, slot, fault)
    trainer.seen, trainer.committed = {}, []
    client = QuorumClient(info, slot, wait_s=120.0)
    try:
        store = store_client("127.0.0.1", store_port, 30.0)
        outcome: Any = trainer.run(client, store, joining)
        client.close()
    except RuntimeError as exc:  # the injected fault: the driver sees the connection close
        client.abandon()
        outcome = repr(exc)
    out.put((slot, joining, outcome, trainer.seen, trainer.committed, trainer.whole_state))


def _reference(total_steps: int) -> dict[str, torch.Tensor]:
    """The same steps in one process: torch.optim's SGD on each step's mean loss."""
    spec = _spec()
    model, cursor = spec.model, HSDPSteps.cursor_for(spec, WORKERS)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(total_steps):
        x, y = spec.train.rows_at(cursor.step_rows(step))
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model.state_dict()


def test_a_lost_shard_benches_its_replica_group_which_heals_and_rejoins_whole() -> None:
    total = HSDPSteps.cursor_for(_spec(), WORKERS).total_steps  # 60
    quorum = Quorum(WORKERS, total, replica=SHARD)
    expected = _reference(total)  # (its optimizer's lazy imports also serve the forked workers)
    # forked before this process starts any thread of its own (the store's, the endpoint's); FSDP2
    # is imported above, so each worker starts without importing anything
    context = mp.get_context("fork")
    out = context.Queue()
    faults = {1: Fault("raise", 1, 10), 2: Fault("slow", 2, 1, delay_ms=30)}  # in epoch 1
    slots = [*range(WORKERS), 1]  # the last: worker 1's replacement
    setups = [context.Queue() for _ in slots]
    processes = [
        context.Process(target=_slot, args=(w, faults.get(w) if i < WORKERS else None, setups[i], out))
        for i, w in enumerate(slots)
    ]
    results: list[tuple[Any, ...]] = []
    try:
        for process in processes:
            process.start()
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=10.0) as server:
            for setup in setups[:WORKERS]:
                setup.put((server.info, store.port, False))
            results.append(out.get(timeout=120))  # worker 1's fault
            while quorum.step < 14 and not quorum.done:  # the other group alone for a few steps first
                time.sleep(0.01)
            setups[-1].put((server.info, store.port, True))
            results.extend(out.get(timeout=120) for _ in range(WORKERS))
        for process in processes:
            process.join(30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
        for q in (out, *setups):
            q.close()
    assert quorum.failed is None and server.unexpected == 0, quorum.failed
    outcomes = {(slot, joining): outcome for slot, joining, outcome, *_ in results}
    assert "fault injected" in str(outcomes[(1, False)])
    # worker 0 leaves with its group-mate; the group rejoins whole, healed by shard index
    records = [(r["worker"], r["kind"], r.get("healed_from")) for r in quorum.records]
    assert records == [(1, "leave", None), (0, "leave", None), (0, "join", 2), (1, "join", 3)]
    left, joined = quorum.records[0]["step"], quorum.records[2]["step"]
    assert left == 9 and 14 <= joined < total and quorum.records[3]["bytes"] > 0
    # no step repeated or dropped: the other group commits every step once, the benched group
    # every step but those it was out for
    committed = {(slot, joining): steps for slot, joining, _, _, steps, _ in results}
    assert committed[(2, False)] == committed[(3, False)] == list(range(total))
    assert committed[(0, False)] == [*range(left), *range(joined, total)]
    assert committed[(1, False)] == list(range(left)) and committed[(1, True)] == list(range(joined, total))
    # every epoch: each row exactly once over all workers' committed steps
    for epoch in range(EPOCHS):
        counted: Counter[int] = Counter()
        for _, _, _, seen, *_ in results:
            counted.update(seen.get(epoch, Counter()))
        assert counted == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
    [report] = [o for o in outcomes.values() if isinstance(o, WorkerReport)]
    assert [h["samples"] for h in report.history] == [ROWS] * EPOCHS
    trained = state_io.state_from_bytes(report.state)
    assert set(trained) == set(expected)
    for name, value in expected.items():  # float32 sums in another order, over 60 momentum steps
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(trained["0.weight"], _spec().model.state_dict()["0.weight"])  # (it trained)
    # the healed group ends on the very same parameters: the same summed shards, the same
    # optimizer state (its momentum came with the heal)
    for slot, joining, _, _, _, whole in results:
        if (slot, joining) != (1, False):
            healed = state_io.state_from_bytes(whole)
            assert all(torch.equal(healed[name], value) for name, value in trained.items()), slot
