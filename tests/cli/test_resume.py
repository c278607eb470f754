"""The driver itself killed mid-run (``SPARKDP_FAULT=kill-driver``: worker 0 SIGKILLs it), then
``sparkdp train --resume``: the job completes, and a damaged newest checkpoint is skipped for
the one before it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
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
