"""``benchmarks/ps_load.py`` (``make bench-ps-load``) at a tiny size: client processes against one
TCP parameter server, and its check that no acknowledged push was lost or doubled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sparkdp

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]


def test_the_load_benchmark_runs_and_loses_no_push(tmp_path):
    out = tmp_path / "load.json"
    # the clients are spawned interpreters: they must import the sparkdp this test imports
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(sparkdp.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ps_load.py"),
            "--clients",
            "3",
            "--seconds",
            "3",
            "--numel",
            "10000",
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ps_load: PASS" in proc.stdout
    result = json.loads(out.read_text())
    assert result["problems"] == [] and result["centre_exact"]
    assert result["pushes_applied"] == result["pushes_acked"] == result["pushes_sent"] > 3
    assert result["pulls"] >= result["pushes_sent"]
    assert 0 < result["push_p50_ms"] <= result["push_p99_ms"]
    assert result["rss_after_mb"] - result["rss_before_mb"] < 200  # the server keeps no per-push state
