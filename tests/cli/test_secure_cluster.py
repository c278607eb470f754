"""A Spark with authentication and encryption on: asynchronous training runs, and the parameter
server's job secret appears nowhere in the event log (what Spark's history server shows as the UI)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_caffe_train import needs_fashion

JOB = '''
import json, sys
import sparkdp.ps.transport.tcp as tcp

SECRET = bytes(range(7, 39))  # a known job secret, so that the test can search for it
tcp.new_secret = lambda: SECRET

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model

spark = sparkdp.session("local[2]", conf={
    "spark.authenticate": "true", "spark.authenticate.secret": "spark-shared-secret-for-this-test",
    "spark.network.crypto.enabled": "true", "spark.io.encryption.enabled": "true",
    "spark.eventLog.enabled": "true", "spark.eventLog.dir": sys.argv[1], "spark.eventLog.compress": "false",
})
train, test = dataset_tensors(load_dataset("fashion-mnist", limit=2000))
result = sparkdp.fit(build_model("linear"), train, eval_data=test, strategy="asgd", workers=2, epochs=1,
                     spark=spark, show_progress=False)
print(json.dumps({"accuracy": result.test_accuracy, "secret": SECRET.hex()}))
'''


@pytest.mark.e2e
@needs_fashion
def test_async_training_on_an_authenticated_encrypted_spark_keeps_the_secret_out_of_the_event_log(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    logs = tmp_path / "events"
    logs.mkdir()
    proc = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(logs)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["accuracy"] > 0.5, run
    secret = bytes.fromhex(run["secret"])
    events = b"".join(p.read_bytes() for p in Path(logs).rglob("*") if p.is_file())
    assert b"SparkListenerTaskEnd" in events and b"sparkdp" in events  # the log is there and readable
    for form in (secret, secret.hex().encode(), base64.b64encode(secret), secret.hex().upper().encode()):
        assert form not in events
    assert b"spark-shared-secret-for-this-test" not in events  # Spark redacts its own, too
