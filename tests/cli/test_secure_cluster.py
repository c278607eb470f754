"""A Spark with authentication and encryption on — TLS (``spark.ssl.enabled`` with keystores) or
AES (``spark.network.crypto.enabled``) on its RPC — on ``local-cluster`` (executor JVMs of their
own, so the driver and executors really talk over the encrypted RPC): training runs, the
driver's RPC port speaks TLS with the test's certificate, and the parameter server's job secret
appears nowhere in the event log (what Spark's history server shows as the UI)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from tests.cli.test_caffe_train import needs_fashion

PASSWORD = "store-pass-for-this-test"

JOB = """
import json, socket, ssl, sys
import sparkdp.ps.transport.tcp as tcp

SECRET = bytes(range(7, 39))  # a known job secret, so that the test can search for it
tcp.new_secret = lambda: SECRET

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model

events, extra = sys.argv[1], json.loads(sys.argv[2])
spark = sparkdp.session("local-cluster[2,1,1024]", conf={
    "spark.authenticate": "true", "spark.authenticate.secret": "spark-shared-secret-for-this-test",
    "spark.io.encryption.enabled": "true", "spark.task.maxFailures": "1",
    "spark.eventLog.enabled": "true", "spark.eventLog.dir": events, "spark.eventLog.compress": "false", **extra,
})
train, test = dataset_tensors(load_dataset("fashion-mnist", limit=2000))
result = sparkdp.fit(build_model("linear"), train, eval_data=test, strategy="asgd", workers=2, epochs=1,
                     spark=spark, show_progress=False)
tls = None
if len(sys.argv) > 3:  # the driver's RPC endpoint must complete a TLS handshake with our certificate
    context = ssl.create_default_context(cafile=sys.argv[3])
    context.check_hostname = False
    port = int(spark.sparkContext.getConf().get("spark.driver.port"))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw) as conn:
            tls = conn.version()
print(json.dumps({"accuracy": result.test_accuracy, "secret": SECRET.hex(), "tls": tls}))
"""


def _keystore(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed PKCS12 keystore (also the truststore) for 127.0.0.1, and its PEM certificate."""
    keytool = shutil.which("keytool") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "keytool")
    store, pem = tmp_path / "spark.p12", tmp_path / "spark.pem"
    common = ["-alias", "spark", "-keystore", str(store), "-storetype", "PKCS12", "-storepass", PASSWORD]
    subprocess.run(
        [
            keytool,
            "-genkeypair",
            *common,
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-dname",
            "CN=127.0.0.1",
            "-ext",
            "SAN=ip:127.0.0.1",
            "-validity",
            "2",
            "-keypass",
            PASSWORD,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [keytool, "-exportcert", "-rfc", *common, "-file", str(pem)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return store, pem


@pytest.mark.e2e
@needs_fashion
@pytest.mark.parametrize(
    "encryption", ["tls", pytest.param("aes", marks=pytest.mark.slow)]
)  # aes: make test-all
def test_async_training_on_an_authenticated_encrypted_spark_keeps_the_secret_out_of_the_event_log(
    tmp_path, encryption
):
    args: list[str] = []
    if encryption == "tls":
        store, pem = _keystore(tmp_path)
        extra = {
            "spark.ssl.enabled": "true",
            "spark.ssl.rpc.enabled": "true",
            "spark.ssl.protocol": "TLSv1.3",
            "spark.ssl.keyStore": str(store),
            "spark.ssl.keyStoreType": "PKCS12",
            "spark.ssl.keyStorePassword": PASSWORD,
            "spark.ssl.keyPassword": PASSWORD,
            "spark.ssl.trustStore": str(store),
            "spark.ssl.trustStoreType": "PKCS12",
            "spark.ssl.trustStorePassword": PASSWORD,
        }
        args = [str(pem)]
    else:
        extra = {"spark.network.crypto.enabled": "true"}
    (tmp_path / "job.py").write_text(JOB)
    logs = tmp_path / "events"
    logs.mkdir()
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "job.py"), str(logs), json.dumps(extra), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run["accuracy"] > 0.5, run
    if encryption == "tls":
        assert run["tls"] == "TLSv1.3", run
    secret = bytes.fromhex(run["secret"])
    events = b"".join(p.read_bytes() for p in Path(logs).rglob("*") if p.is_file())
    assert b"SparkListenerTaskEnd" in events and b"sparkdp" in events  # the log is there and readable
    for form in (secret, secret.hex().encode(), base64.b64encode(secret), secret.hex().upper().encode()):
        assert form not in events
    assert b"spark-shared-secret-for-this-test" not in events  # Spark redacts its own, too
    assert PASSWORD.encode() not in events  # and the keystore passwords
