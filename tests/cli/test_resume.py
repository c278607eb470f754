"""The driver itself killed mid-run, then ``sparkdp train --resume``: the job completes, and a
damaged newest checkpoint is skipped for the one before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from .test_cli import SPARKDP, _explain, needs_fashion, sparkdp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

JOB = ["train", "--dataset", "fashion-mnist", "--model", "cnn-small", "--limit", "4000", "--workers", "2",
       "--epochs", "3", "--memory-format", "contiguous"]


def _kill_when_checkpointed(proc: subprocess.Popen, directory, at_least: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if len([p for p in os.listdir(directory) if p.startswith("ckpt-")]) >= at_least:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the job finished before it could be killed"
    family = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)  # the driver dies without any chance to clean up
    proc.wait(timeout=30)
    # Its JVM notices the closed gateway pipe and exits; whatever is left is killed here.
    _, alive = psutil.wait_procs(family, timeout=30)
    for p in alive:
        p.kill()


@needs_fashion
def test_driver_killed_then_resumed_completes_and_skips_a_damaged_checkpoint(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    proc = subprocess.Popen([*SPARKDP, *JOB, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _kill_when_checkpointed(proc, ckpt, at_least=3, deadline_s=180)
    finally:
        if proc.poll() is None:
            proc.kill()
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
