"""The live monitor's view of a per-step fault-tolerant job (``driver.jobs.step.QuorumProgress``):
the quorum's committed steps and rows and its size through a leave and a join reach the hub's
progress line and run log, and ``sparkdp report`` marks the leave and the join where the quorum
recorded them. A real quorum endpoint and hub in this process; no Spark."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkdp.driver.jobs.step import QuorumProgress
from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.monitor.hub import MonitorHub
from sparkdp.monitor.report import load_run, pyplot, throughput_figure
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.quorum_messages import JOINING
from sparkdp.train.row_cursor import RowCursor

pytestmark = pytest.mark.timeout(60)


def _records(run_dir, kind):
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def _until(predicate) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_quorum_size_and_committed_rows_reach_the_progress_line_run_log_and_report(tmp_path) -> None:
    cursor = RowCursor(rows=10, global_batch=4, epochs=2)  # steps of 4, 4 and 2 rows, 3 an epoch
    quorum = Quorum(2, cursor.total_steps)
    run_dir = tmp_path / "run"
    hub = MonitorHub(world_size=2, config={"strategy": "allreduce"}, run_dir=str(run_dir), display=False)
    progress = QuorumProgress(hub, cursor, quorum)
    with (
        hub,
        QuorumServer(quorum, "127.0.0.1", on_record=progress.membership) as server,
        ThreadPoolExecutor(2) as pool,
    ):
        a, b = (QuorumClient(server.info, w, wait_s=10.0, heartbeat_s=0.1) for w in (0, 1))
        list(pool.map(lambda c: c.boundary(0, None), (a, b)))  # the first quorum
        list(pool.map(lambda c: c.boundary(0, True), (a, b)))  # step 1 commits
        progress.tell()
        assert "step 1/3" in hub.display.headline() and "quorum 2/2" in hub.display.headline()
        b.abandon()  # worker 1 is lost
        _until(lambda: "quorum 1/2" in hub.display.headline())
        assert not a.boundary(1, True)[0].commit  # the step it was part of is run again
        assert a.boundary(1, True)[0].commit  # step 2
        progress.tell(final=True)
        joiner = QuorumClient(server.info, 1, wait_s=10.0)
        joined = pool.submit(joiner.boundary, JOINING, None)
        _until(lambda: 1 in quorum.arrived)
        a.boundary(2, True)  # step 3 commits; worker 1 joins, healed from worker 0
        a.heal((1,), b"state")
        joined.result(10)
        _until(lambda: "quorum 2/2" in hub.display.headline())
        progress.tell(final=True)
        assert "epoch 2/2 step 0/3" in hub.display.headline()  # 3 steps done: epoch 1 ended
        for client in (a, joiner):
            client.close()
    jobs = _records(run_dir, "job")
    assert [(j["steps"], j["samples"], j["quorum"]) for j in jobs] == [(1, 4, 2), (2, 8, 1), (3, 10, 2)]
    assert jobs[0]["samples_per_s"] is None  # no window before the first
    assert jobs[1]["samples_per_s"] == pytest.approx(4 / (jobs[1]["time"] - jobs[0]["time"]))
    changes = _records(run_dir, "membership")
    assert [(c["kind"], c["worker"], c["step"], c["quorum"]) for c in changes[:2]] == [
        ("leave", 1, 1, 1),
        ("join", 1, 3, 2),
    ]  # (then both leave: this test closes them before the job's 6 steps)
    run = load_run(run_dir)
    fig = throughput_figure([run])
    marks = [(line.get_xdata()[0], line.get_linestyle()) for line in fig.axes[0].lines[1:]]
    styles = {"leave": "--", "join": ":"}
    assert sorted(marks) == sorted((c["time"] - run.start, styles[c["kind"]]) for c in changes)
    pyplot().close(fig)


def test_without_a_monitor_the_quorum_tells_no_one() -> None:
    quorum = Quorum(1, 3)
    progress = QuorumProgress(None, RowCursor(rows=3, global_batch=1, epochs=1), quorum)
    progress.tell(final=True)
    progress.membership({"worker": 0, "step": 0, "kind": "leave", "cause": "x", "time": 0.0})
