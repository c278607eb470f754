"""Elastic recovery on a real standalone cluster: one of two Spark workers dies for good mid-run
(its JVM, executor and Python workers SIGKILLed); with ``--min-workers 1`` the job continues on
the one slot left, from the latest checkpoint, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from tests.helpers.standalone import StandaloneCluster

from .test_cli import SPARKDP, needs_fashion

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(420)]


@needs_fashion
@pytest.mark.slow  # (make test-all) a standalone cluster; tests/spark/test_recovery.py continues a job on fewer workers in make test
def test_a_lost_worker_machine_shrinks_the_job_to_the_slots_left(tmp_path):
    (tmp_path / "cluster").mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1).start()
    ckpt, summary, err = tmp_path / "ckpt", tmp_path / "summary.json", tmp_path / "stderr.txt"
    try:
        with open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [
                    *SPARKDP,
                    "train",
                    "--dataset",
                    "fashion-mnist",
                    "--model",
                    "cnn-small",
                    "--limit",
                    "6000",
                    "--workers",
                    "2",
                    "--min-workers",
                    "1",
                    "--epochs",
                    "2",
                    "--master",
                    cluster.master_url,
                    "--checkpoint-dir",
                    str(ckpt),
                    "--checkpoint-every",
                    "10",
                    "--json-out",
                    str(summary),
                ],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=cluster.env(),
            )
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:
                if ckpt.is_dir() and any(p.startswith("ckpt-") for p in os.listdir(ckpt)):
                    break
                time.sleep(0.2)
            assert proc.poll() is None, err.read_text()[-3000:]
            cluster.kill_worker(1)  # the machine is gone: its slot does not come back
            assert proc.wait(timeout=300) == 0, err.read_text()[-3000:]
    finally:
        cluster.stop()
    text = err.read_text()
    assert "on 1 of 2 workers (task slots gone)" in text, text[-3000:]
    assert "restart 1 of 3" in text and "at org.apache" not in text
    data = json.loads(summary.read_text())
    assert data["workers"] == 1
    assert [h["epoch"] for h in data["history"]] == [1, 2]
    assert data["test_accuracy"] > 0.5
