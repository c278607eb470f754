"""Parameter servers as Spark tasks (``servers=K``): the whole stack on local[4], and a server
task killed mid-job (SIGKILL, injected with SPARKDP_FAULT) that the job recovers from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def _job(case: str, **args) -> tuple[Any, str]:
    """Run one case (or, with ``case="cases"``, the list ``args["cases"]`` on one Spark session)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("SPARKDP_FAULT", None)
    env.update(args.pop("env", {}))
    job = args if case == "cases" else {"case": case, **args}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "spark" / "servers_job.py"),
            json.dumps(job),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory):
    """The one-worker and the shrunk cases, in this order, in one process (one JVM start). The
    fault kills worker rank 1 at step 20: the one-worker case has no rank 1 and 8 steps."""
    dirs = {case: tmp_path_factory.mktemp(case) for case in ("one-worker", "shrunk")}
    outs, log = _job(
        "cases",
        cases=[{"case": case, "dir": str(d)} for case, d in dirs.items()],
        env={"SPARKDP_FAULT": "kill:rank=1:step=20"},
    )
    return {case: (out, dirs[case]) for case, out in zip(dirs, outs)}, log


def test_one_worker_through_two_server_tasks_equals_torch_sgd(two_cases):
    results, _ = two_cases
    out, tmp_path = results["one-worker"]
    assert out["max_error"] < 1e-6, out
    assert [s["shard"] for s in out["servers"]] == [0, 1]
    assert all(s["pushes_applied"] == 8 and s["duplicates_dropped"] == 0 for s in out["servers"])
    # each server receives its key range of every push: together, the model 8 times
    assert sum(s["bytes_in"] for s in out["servers"]) == 8 * out["model_bytes"] == out["server"]["bytes_in"]
    assert 0 < out["servers"][0]["bytes_in"] < 8 * out["model_bytes"]
    # each server task reported to the live monitor: the run log has its figures by shard
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    last = {r["shard"]: r for r in records if r.get("type") == "server"}
    assert sorted(last) == [0, 1], records[-3:]
    assert [last[s]["pushes_applied"] for s in (0, 1)] == [8, 8]
    assert [last[s]["bytes_in"] for s in (0, 1)] == [s["bytes_in"] for s in out["servers"]]
    assert all(r["rank"] >= 1 for r in last.values())  # authenticated as ids no worker has


@pytest.mark.slow  # (make test-all) one-worker equivalence through two server tasks stays in make test
def test_a_killed_server_task_restarts_the_stage_from_the_servers_checkpoints(tmp_path):
    out, log = _job("killed-server", dir=str(tmp_path), env={"SPARKDP_FAULT": "kill-server:rank=1:step=40"})
    assert len(out["restarts"]) == 1, out
    assert "restart 1 of 3 from the servers' newest checkpoints" in log
    assert "sparkdp: recovered from failure 1 (" in log and ") on 2 of 2 workers" in log
    assert "the 2 servers resume from ps-s0of2-" in log and "ps-s1of2-" in log
    assert out["accuracy"] > 0.85, out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.startswith("ps-s0of2-") for n in names) and any(n.startswith("ps-s1of2-") for n in names), (
        names
    )
    # after the restart the workers continue their numbering: nothing is refused or applied twice
    assert all(s["rejected"] == 0 for s in out["servers"]), out
    # resuming the finished job trains nothing and gives back the centre the servers saved
    again, log = _job("resumed", dir=str(tmp_path))
    assert again["samples"] == 0 and "4 of 4 epoch(s) covered by the applied pushes" in log
    assert again["accuracy"] == out["accuracy"], (again, out)


def test_a_killed_worker_beside_two_servers_continues_on_the_workers_left(two_cases):
    """servers=2 with min_workers=1: after a worker is killed and only 3 task slots are left (the
    2 servers and 1 worker), the stage restarts from the servers' checkpoints on one worker."""
    results, log = two_cases
    out, _ = results["shrunk"]
    lines = [
        ln.split(" WARNING ", 1)[1]
        for ln in log.splitlines()
        if " WARNING sparkdp:" in ln and ("-- restart" in ln or "sparkdp: recovered" in ln)
    ]
    assert len(lines) == 2, log[-3000:]
    # Spark names the stage's task, and the 2 server tasks come first: worker 1 is task 3
    assert lines[0].startswith("sparkdp: worker 3 died") and lines[0].endswith(
        "-- restart 1 of 3 from the servers' newest checkpoints on 1 of 2 workers (task slots gone)"
    ), lines
    assert lines[1].startswith("sparkdp: recovered from failure 1 (worker 3 died") and lines[1].endswith(
        "on 1 of 2 workers"
    ), lines
    assert out["workers"] == 1 and len(out["restarts"]) == 1 and out["restarts"][0]["workers"] == 1, out
    assert out["accuracy"] > 0.85, out


def test_a_killed_worker_around_the_drivers_server_continues_on_the_workers_left(tmp_path):
    """The server on the driver with min_workers=1: after a worker is killed and only 1 task slot
    is left, the tasks restart on one worker from the server's current centre, as with servers
    on the executors."""
    out, log = _job("driver-shrunk", dir=str(tmp_path), env={"SPARKDP_FAULT": "kill:rank=1:step=20"})
    lines = [
        ln.split(" WARNING ", 1)[1]
        for ln in log.splitlines()
        if " WARNING sparkdp:" in ln and "parameter server's current centre" in ln
    ]
    assert len(lines) == 1 and lines[0].endswith(
        "-- restart 1 of 3 from the parameter server's current centre on 1 of 2 workers (task slots gone)"
    ), log[-3000:]
    assert [ln for ln in log.splitlines() if "recovered from failure 1" in ln and "on 1 of 2 workers" in ln]
    assert out["workers"] == 1 and len(out["restarts"]) == 1 and out["restarts"][0]["workers"] == 1, out
    assert out["preemptions"] == [], out
    assert out["accuracy"] > 0.85, out
