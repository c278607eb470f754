"""``spark-submit`` runs sparkdp's command line, and sparkdp keeps spark-submit's settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from tests.cli.test_caffe_train import needs_fashion

SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"


@pytest.mark.e2e
@needs_fashion
def test_spark_submit_runs_a_job_on_the_master_it_was_given(tmp_path):
    from sparkdp.cli import submit

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    events = tmp_path / "events"
    events.mkdir()
    proc = subprocess.run(
        [
            str(SPARK_SUBMIT),
            "--master",
            "local[3]",
            "--conf",
            "spark.ui.enabled=false",
            # a setting sparkdp has a default for: spark-submit's value must win
            "--conf",
            "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures=7",
            "--conf",
            "spark.eventLog.enabled=true",
            "--conf",
            "spark.eventLog.compress=false",
            "--conf",
            f"spark.eventLog.dir={events}",
            submit.__file__,
            "train",
            "--dataset",
            "fashion-mnist",
            "--model",
            "linear",
            "--limit",
            "2000",
            "--epochs",
            "1",
            "-q",
            "--json-out",
            str(tmp_path / "run.json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((tmp_path / "run.json").read_text())
    # no --workers: one per task slot of spark-submit's local[3], not sparkdp's own local[2] default
    assert run["workers"] == 3 and run["test_accuracy"] > 0.4, run
    log = [
        json.loads(line)
        for p in events.rglob("*")
        if p.is_file() and not p.name.startswith(".")
        for line in p.read_text().splitlines()
    ]
    properties = next(e for e in log if e["Event"] == "SparkListenerEnvironmentUpdate")["Spark Properties"]
    assert dict(properties)["spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures"] == "7"
