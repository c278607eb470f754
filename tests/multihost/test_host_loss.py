"""A whole host taken away mid-job (its link down, every process on it killed, so no connection
is closed cleanly): an asynchronous job finishes on the hosts that remain."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from . import netbed

pytestmark = [pytest.mark.multihost]


@pytest.mark.timeout(420)
def test_asgd_finishes_after_a_worker_host_is_taken_away():
    netbed.remove_stale()
    with netbed.NetBed(netbed.cluster_hosts(2), rate="1gbit") as bed:
        cluster = netbed.SparkOnNetBed(bed, ["worker-0", "worker-1"]).start()
        job = bed.directory / "job.json"
        # Spark notices a silent executor by its missing heartbeats: shorten that from 120 s
        job.write_text(
            json.dumps(
                {
                    "limit": 6000,
                    "conf": {
                        "spark.network.timeout": "15s",
                        "spark.executor.heartbeatInterval": "3s",
                        "spark.network.timeoutInterval": "5s",
                    },
                    "fit": {"strategy": "asgd", "workers": 2, "epochs": 1, "optimizer_options": {"lr": 0.05}},
                }
            )
        )
        log = bed.directory / "driver.log"
        driver = bed.popen(
            "driver",
            [sys.executable, str(Path(__file__).with_name("driver_job.py")), cluster.master_url, str(job)],
            env=cluster.env(),
            log=log,
        )
        # wait until both workers are pushing (bytes on worker-1's link), then take worker-1 away
        deadline = time.monotonic() + 180
        while bed.qdisc_stats("worker-1")["sent"] < 100_000_000:
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "worker-1 never started pushing"
            time.sleep(0.5)
        bed.kill_host("worker-1")
        killed_at = time.monotonic()
        driver.wait(300)
        lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        assert driver.returncode == 0 and lines, log.read_text()[-4000:]
        out = json.loads(lines[-1].removeprefix("RESULT "))
    assert not bed.leftovers()
    assert sorted(e["hostname"] for e in out["executors"]) == ["worker-0", "worker-1"]
    assert "error" not in out, out["error"]
    history = out["result"]["history"]
    assert history[-1]["test_accuracy"] > 0.25, history
    print(f"finished {time.monotonic() - killed_at:.0f} s after worker-1 was taken away: {history}")


@pytest.mark.timeout(420)
def test_allreduce_resumes_on_the_remaining_host_from_a_checkpoint():
    """The synchronous job loses a host mid-epoch: rank 0's all-reduce times out, the stage fails,
    and sparkdp restarts it from the latest checkpoint (a directory every host sees, as NFS
    would be) on the one worker left (min_workers=1)."""
    netbed.remove_stale()
    with netbed.NetBed(netbed.cluster_hosts(2), rate="1gbit") as bed:
        cluster = netbed.SparkOnNetBed(bed, ["worker-0", "worker-1"]).start()
        checkpoints = bed.directory / "checkpoints"
        checkpoints.mkdir(mode=0o777)
        job = bed.directory / "job.json"
        job.write_text(
            json.dumps(
                {
                    "limit": 6000,
                    "conf": {
                        "spark.network.timeout": "15s",
                        "spark.executor.heartbeatInterval": "3s",
                        "spark.network.timeoutInterval": "5s",
                    },
                    "fit": {
                        "strategy": "allreduce",
                        "workers": 2,
                        "epochs": 2,
                        "optimizer_options": {"lr": 0.05},
                        "pg_timeout_s": 20,
                        "checkpoint_dir": str(checkpoints),
                        "checkpoint_every": 10,
                        "max_restarts": 2,
                        "min_workers": 1,
                    },
                }
            )
        )
        log = bed.directory / "driver.log"
        driver = bed.popen(
            "driver",
            [sys.executable, str(Path(__file__).with_name("driver_job.py")), cluster.master_url, str(job)],
            env=cluster.env(),
            log=log,
        )
        deadline = time.monotonic() + 180
        while not any(checkpoints.iterdir()):
            assert driver.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.5)
        bed.kill_host("worker-1")
        driver.wait(360)
        text = log.read_text()
        lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
        assert driver.returncode == 0 and lines, text[-4000:]
        out = json.loads(lines[-1].removeprefix("RESULT "))
    assert not bed.leftovers()
    assert "error" not in out, out["error"]
    restarts = [line for line in text.splitlines() if "-- restart " in line]
    assert restarts and "on 1 of 2 workers (task slots gone)" in restarts[0], text[-4000:]
    history = out["result"]["history"]
    assert [h["epoch"] for h in history][-1] == 2, history
    assert history[-1]["test_accuracy"] > 0.25, history
    print(f"{restarts[0]}\nhistory: {history}")
