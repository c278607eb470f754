"""Asynchronous training under dynamic allocation on a real standalone cluster: executors are
requested when tasks wait, leave when idle, and come back for the next job; four workers on at
most two executors run in waves. (Synchronous jobs refuse dynamic allocation up front:
tests/spark/test_launcher.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.standalone import StandaloneCluster

from .test_cli import needs_fashion

# a minute of a standalone cluster starting and losing executors: behind `make test-all`
pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(420)]

JOB = textwrap.dedent("""
    import json, sys, time
    import torch
    import sparkdp
    from sparkdp.data.datasets import dataset_tensors, load_dataset
    from sparkdp.models import build_model

    spark = sparkdp.session(sys.argv[1], conf={
        "spark.dynamicAllocation.enabled": "true",
        # standalone has no external shuffle service here; sparkdp's jobs shuffle nothing anyway
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.minExecutors": "0", "spark.dynamicAllocation.initialExecutors": "0",
        "spark.dynamicAllocation.maxExecutors": "2", "spark.dynamicAllocation.executorIdleTimeout": "2s",
        "spark.dynamicAllocation.schedulerBacklogTimeout": "1s", "spark.executor.cores": "1",
        "spark.executor.memory": "1g",
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": sys.argv[2], "spark.eventLog.compress": "false",
    })
    sc = spark.sparkContext
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=3000))
    out = {"executors_at_start": sc._jsc.sc().getExecutorIds().size()}
    for job, workers in (("waves", 4), ("after_idle", 2)):
        torch.manual_seed(0)
        result = sparkdp.fit(build_model("linear"), train, eval_data=test, strategy="asgd", workers=workers,
                             epochs=1, batch_size=32, spark=spark, show_progress=False)
        out[job] = {"accuracy": result.test_accuracy, "workers": result.workers,
                    "pushes": result.details["server"]["pushes_applied"]}
        deadline = time.monotonic() + 60  # idle executors leave after executorIdleTimeout
        while sc._jsc.sc().getExecutorIds().size() and time.monotonic() < deadline:
            time.sleep(0.5)
        out[job]["executors_left_after"] = sc._jsc.sc().getExecutorIds().size()
    spark.stop()  # drains the listener bus, so the event log holds every executor event
    print("RESULT " + json.dumps(out))
""")


@needs_fashion
def test_async_jobs_run_in_waves_while_executors_arrive_and_leave(tmp_path):
    (tmp_path / "cluster").mkdir()
    events = tmp_path / "events"
    events.mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1).start()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", JOB, cluster.master_url, str(events)],
            capture_output=True,
            text=True,
            timeout=360,
            env=cluster.env(),
        )
    finally:
        cluster.stop()
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert out["executors_at_start"] == 0, out  # nothing held before the first job asks
    for job, workers in (("waves", 4), ("after_idle", 2)):
        assert out[job]["workers"] == workers and out[job]["accuracy"] > 0.6, out
        assert out[job]["pushes"] > 0 and out[job]["executors_left_after"] == 0, out
    log = [
        json.loads(line)
        for p in Path(events).rglob("*")
        if p.is_file() and not p.name.startswith(".")
        for line in p.read_text().splitlines()
    ]
    changes = sorted(
        (e["Timestamp"], +1 if e["Event"] == "SparkListenerExecutorAdded" else -1)
        for e in log
        if e["Event"] in ("SparkListenerExecutorAdded", "SparkListenerExecutorRemoved")
    )
    held, most, came_back = 0, 0, False
    for _, change in changes:
        came_back |= change > 0 and held == 0 and most > 0  # an executor requested after all had left
        held += change
        most = max(most, held)
    # How many executors the first job gets depends on how fast they start (one may run all four
    # tasks in waves); what must hold is the cap, that all of them leave, and that they come back.
    assert 1 <= most <= 2 and held == 0 and came_back, changes
