"""The driver itself killed mid-run (``SPARKDP_FAULT=kill-driver``: worker 0 SIGKILLs it), then
``sparkdp train --resume``: the job completes, and a damaged newest checkpoint is skipped for
the one before it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess

import pytest

from .test_cli import SPARKDP, _explain, needs_fashion, sparkdp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

JOB = [
    "train",
    "--dataset",
    "fashion-mnist",
    "--model",
    "mlp",
    "--limit",
    "4000",
    "--workers",
    "2",
    "--epochs",
    "3",
    "--memory-format",
    "contiguous",
]


def _run_until_the_driver_is_killed(args: list[str]) -> subprocess.CompletedProcess:
    """Run the job with SPARKDP_FAULT=kill-driver: worker 0 SIGKILLs the driver mid-run."""
    proc = subprocess.Popen(
        [*SPARKDP, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPARKDP_FAULT": "kill-driver:step=25"},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        # the JVM notices the closed gateway pipe and exits; anything left of the job goes here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@needs_fashion
def test_driver_killed_then_resumed_completes_and_skips_a_damaged_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    killed = _run_until_the_driver_is_killed([*JOB, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"])
    assert killed.returncode == -signal.SIGKILL, _explain(killed)
    names = sorted(p for p in os.listdir(ckpt) if p.startswith("ckpt-"))
    assert len(names) == 3  # keep 3 (default)
    (ckpt / names[-1]).write_bytes(b"not a checkpoint")  # as if the disk had failed mid-write
    summary = tmp_path / "summary.json"
    done = sparkdp(*JOB, "--resume", str(ckpt), "--json-out", str(summary))
    assert done.returncode == 0, _explain(done)
    assert f"skipping the checkpoint {ckpt / names[-1]}" in done.stderr
    history = json.loads(summary.read_text())["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert sum(h["samples"] for h in history) == 3 * 4000
    assert history[-1]["test_accuracy"] > 0.6
