"""Per-step fault tolerance's checkpoints, in one process: the quorum's rank 0 saves the committed
state with its row cursor; every worker is lost mid-epoch; a new quorum resumes from the newest
checkpoint. Counted over both runs (the first run's steps up to the checkpoint, the second's),
each epoch's rows are trained once, and (allreduce) the model is the one an undisturbed run
trains. (A diloco worker's inner optimizer is its own; every worker resumes with rank 0's, as a
joiner heals with its healer's, so a resumed diloco run is not bitwise the undisturbed one.)

A checkpoint without its cursor (a resume that starts the epoch over) trains the epoch's first
rows twice; this test then fails."""

from __future__ import annotations

import copy
import threading
from collections import Counter
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from sparkdp import state as state_io
from sparkdp.comm.quorum_group import store_client
from sparkdp.config import CheckpointConfig
from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.errors import ConfigError
from sparkdp.train.checkpoint import CheckpointPolicy, latest_checkpoint
from sparkdp.train.faults import Fault
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.row_cursor import RowCursor
from sparkdp.train.step_checkpoint import order_key, start_state
from sparkdp.train.step_worker import StepLink, StepTrainer
from tests.train.test_step_parquet import ROWS, WORKERS, _spec, write_ids
from tests.train.test_step_worker import TRAINERS
from tests.train.test_step_worker import _spec as memory_spec

pytestmark = pytest.mark.timeout(120)


def by_step(base: type[StepTrainer]) -> type[StepTrainer]:
    """``base``, noting the rows of each step it commits, by job step."""

    class ByStep(base):  # type: ignore[valid-type, misc]
        seen: dict[int, list[int]]

        def compute(self, group, decision):
            self.spec.train.last, self.computing = [], self.step
            return super().compute(group, decision)

        def settle(self, commit):
            if commit and self.pending is not None:
                self.seen.setdefault(self.computing, []).extend(self.spec.train.last)
            return super().settle(commit)

    return ByStep


def _run(spec, workers: int, total: int, start: tuple[int, bytes | None], faults, seen) -> dict[int, object]:
    """``workers`` threads from job step ``start[0]`` (state ``start[1]``) to the job's end or their loss."""
    quorum = Quorum(workers, total, step=start[0])
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    outcome: dict[int, object] = {}

    trainers: list[StepTrainer] = []

    def worker(slot: int) -> None:
        trainer = by_step(TRAINERS[spec.strategy.name])(copy.deepcopy(spec), link, slot, faults.get(slot))
        trainers.append(trainer)
        trainer.seen = seen
        client = QuorumClient(link.quorum, slot, wait_s=30.0)
        try:
            outcome[slot] = trainer.run(client, store_client("127.0.0.1", store.port, 30.0), False)
            client.close()
        except (RuntimeError, ConnectionError) as exc:
            client.abandon()
            outcome[slot] = exc

    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        link = StepLink(server.info, ("127.0.0.1", store.port), workers, 1, 30.0, 30.0, start=start[1])
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for trainer in trainers:  # a lost worker's write in flight, finished before the test reads
        if trainer.checkpoints is not None:
            trainer.checkpoints.close()
    return outcome


@pytest.mark.parametrize(
    ("strategy", "options", "data", "lost_at", "saved_at"),
    [  # 50 steps, 25 rounds an epoch
        ("allreduce", {}, "parquet", 80, 78),
        ("allreduce", {}, "memory", 80, 78),
        ("diloco", {"period": 2}, "parquet", 40, 39),
    ],
)
def test_a_full_restart_from_a_step_checkpoint_trains_each_epochs_rows_once(
    tmp_path, strategy, options, data, lost_at, saved_at
) -> None:
    if data == "memory":
        spec = memory_spec(strategy, **options)
    else:
        spec = _spec(write_ids(tmp_path / "d.parquet", ROWS, 37), strategy, **options)
    cursor = TRAINERS[strategy].cursor_for(spec, WORKERS)
    policy = CheckpointPolicy(CheckpointConfig(checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=7))
    first: dict[int, list[int]] = {}
    lost = _run(
        replace(spec, checkpoint=policy),
        WORKERS,
        cursor.total_steps,
        (0, None),
        {w: Fault("raise", w, lost_at) for w in range(WORKERS)},  # every worker, in epoch 2
        first,
    )
    assert all(isinstance(o, RuntimeError) for o in lost.values())
    saved = latest_checkpoint(policy.directory, policy.job_id)
    assert saved is not None and saved.quorum is not None
    assert saved.quorum["cursor"] == {
        **saved.quorum["cursor"],
        "epoch": 1,
        "rows": (saved_at - cursor.steps_per_epoch) * cursor.global_batch,  # every 7 steps of epoch 2
    }
    step, state = start_state(saved, cursor, order_key(cursor.order(1, spec.train)))
    assert step == saved_at and max(first) == lost_at - 2  # (0-based) the next step's loss ended the run
    second: dict[int, list[int]] = {}
    outcome = _run(spec, WORKERS, cursor.total_steps, (step, state), {}, second)
    for epoch in range(2):
        counted = Counter()
        for s, ids in [*((s, i) for s, i in first.items() if s < step), *second.items()]:
            if cursor.epoch_of(s) == epoch:
                counted.update(ids)
        assert counted == Counter(range(ROWS)), f"epoch {epoch + 1}: rows missed or repeated"
    [report] = [r for r in outcome.values() if r is not None]
    assert [h["samples"] for h in report.history] == [ROWS, ROWS]
    if strategy == "diloco":
        return
    [undisturbed] = [r for r in _run(spec, WORKERS, cursor.total_steps, (0, None), {}, {}).values() if r]
    trained, expected = state_io.state_from_bytes(report.state), state_io.state_from_bytes(undisturbed.state)
    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6)


def test_a_cursor_another_order_cannot_continue_is_refused_in_one_line(tmp_path) -> None:
    spec = _spec(write_ids(tmp_path / "d.parquet", ROWS, 37))
    policy = CheckpointPolicy(CheckpointConfig(checkpoint_dir=str(tmp_path), checkpoint_every=7))
    trainer = StepTrainer(replace(spec, checkpoint=policy), _link(), 0, None)
    trainer.step = 7
    trainer.checkpoint(False)
    trainer.checkpoints.close()
    saved = latest_checkpoint(policy.directory, policy.job_id)
    assert saved is not None
    other = RowCursor(ROWS, 8, 2, seed=3, lanes=2)  # two workers: a step of 8 rows
    with pytest.raises(ConfigError, match="84 rows into epoch 1") as info:
        start_state(saved, other, order_key(other.order(0, spec.train)))
    assert "\n" not in str(info.value) and "global_batch" in str(info.value)
    mine = StepTrainer.cursor_for(spec, WORKERS)
    assert start_state(saved, mine, order_key(mine.order(0, spec.train)))[0] == 7
    restart_mode = replace(saved, quorum=None)
    with pytest.raises(ConfigError, match="fault_tolerance='restart' job"):
        start_state(restart_mode, mine, "")


def _link() -> StepLink:
    from sparkdp.ps.transport.base import ConnectInfo

    return StepLink(ConnectInfo("127.0.0.1:1", b"s" * 32), ("127.0.0.1", 1), WORKERS, 1, 30.0, 30.0)
