"""The driver itself killed mid-run (``SPARKDP_FAULT=kill-driver``: worker 0 SIGKILLs it), then
``sparkdp train --resume``: the job completes, and a damaged newest checkpoint is skipped for
the one before it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .conftest import Cli
from .test_cli import SPARKDP, _explain, needs_fashion

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
    """Run the job with SPARKDP_FAULT=kill-driver: worker 0 SIGKILLs the driver mid-run. Returns
    once no process of the job is left, the Python workers included: Spark's worker daemon puts
    them in a process group of their own, and a worker that outlives the driver by a second could
    write a newer checkpoint after the test has chosen the one to damage."""
    marker = f"SPARKDP_TEST_KILLED_JOB={uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [*SPARKDP, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SPARKDP_FAULT": "kill-driver:step=25", **dict([marker.split("=")])},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        # the JVM notices the closed gateway pipe and exits; anything left of the job goes here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _kill_every_process_with(marker.encode())
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_every_process_with(marker: bytes, wait_s: float = 30.0) -> None:
    """SIGKILL every process whose environment holds ``marker`` and wait until none is left."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    left.append(int(entry))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(entry), signal.SIGKILL)
        if not left:
            return
        assert time.monotonic() < deadline, f"processes of the killed job still alive: {left}"
        time.sleep(0.1)


def _killed_then_resumed(tmp: Path) -> Cli:
    """The killed run, in a process of its own, here (it ends with the driver's SIGKILL), its
    newest checkpoint damaged; then the resuming command line, for the one interpreter."""
    ckpt = tmp / "ckpt"
    killed = _run_until_the_driver_is_killed([*JOB, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "5"])
    names = sorted(p for p in os.listdir(ckpt) if p.startswith("ckpt-")) if ckpt.is_dir() else []
    (tmp / "killed.json").write_text(
        json.dumps({"proc": [killed.returncode, killed.stdout, killed.stderr], "names": names})
    )
    if names:
        (ckpt / names[-1]).write_bytes(b"not a checkpoint")  # as if the disk had failed mid-write
    return Cli([*JOB, "--resume", str(ckpt), "--json-out", str(tmp / "summary.json")])


@needs_fashion
@pytest.mark.cli(build=_killed_then_resumed)
def test_driver_killed_then_resumed_completes_and_skips_a_damaged_checkpoint(cli):
    ckpt = cli.tmp / "ckpt"
    before_resume = json.loads((cli.tmp / "killed.json").read_text())
    killed = subprocess.CompletedProcess(SPARKDP, *before_resume["proc"])
    assert killed.returncode == -signal.SIGKILL, _explain(killed)
    names = before_resume["names"]  # the checkpoint directory when the driver had been killed
    assert len(names) == 3  # keep 3 (default)
    summary = cli.tmp / "summary.json"
    (done,) = cli.procs
    assert done.returncode == 0, _explain(done)
    assert f"skipping the checkpoint {ckpt / names[-1]}" in done.stderr
    history = json.loads(summary.read_text())["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert sum(h["samples"] for h in history) == 3 * 4000
    assert history[-1]["test_accuracy"] > 0.6
