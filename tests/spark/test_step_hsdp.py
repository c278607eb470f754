"""Per-step fault tolerance for hsdp end to end: 4 workers in 2 replica groups of 2 shards on
``local[4,4]`` (its own process: the shared session has 2 slots), worker 1 SIGKILLed at step 30
(24 steps an epoch), Spark's task retry as its replacement. Its group-mate leaves with it and
the group rejoins whole, healed shard by shard from the other group, without a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def test_a_killed_shard_costs_its_group_a_rejoin_and_the_job_no_restart() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env["SPARKDP_FAULT"] = "kill:rank=1:step=30"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "spark" / "step_hsdp_job.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    undisturbed, disturbed = runs["undisturbed"], runs["disturbed"]
    assert undisturbed["membership"] == [] and disturbed["restarts"] == []
    records = [(m["worker"], m["kind"], m.get("healed_from")) for m in disturbed["membership"]]
    assert records == [(1, "leave", None), (0, "leave", None), (0, "join", 2), (1, "join", 3)]
    assert [m["step"] for m in disturbed["membership"]][:2] == [29, 29]
    assert disturbed["samples"] == undisturbed["samples"] == [3000] * 4
    assert abs(disturbed["accuracy"] - undisturbed["accuracy"]) <= 0.015
