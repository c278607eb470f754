"""A packed virtual environment shipped with the job (venv-pack + ``spark.archives``) on a real
standalone cluster whose executors' own Python has neither torch nor sparkdp: without the archive
the job stops with a readable EnvironmentProblem; with it, the executors run the archive's
interpreter and train, synchronously and asynchronously.

Slow (it installs torch into a fresh venv and packs 1.4 GB): ``make test-cluster-env``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers.standalone import StandaloneCluster

from .test_cli import needs_fashion

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.spark, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
BARE_PYTHON = sys._base_executable  # the interpreter the driver's venv was made from: no torch, no sparkdp

JOB = textwrap.dedent("""
    import json, sys
    import sparkdp
    from sparkdp.data.datasets import dataset_tensors, load_dataset
    from sparkdp.models import build_model

    conf = {"spark.archives": sys.argv[2] + "#env"} if len(sys.argv) > 2 else {}
    spark = sparkdp.session(sys.argv[1], conf=conf)

    def where(_):
        import sys as s, torch, sparkdp as d
        yield {"python": s.executable, "sparkdp": d.__file__, "torch": torch.__file__}

    out = {"executors": spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()} if conf else {}
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=2000))
    for strategy in ("allreduce", "asgd"):
        result = sparkdp.fit(build_model("linear"), train, eval_data=test, strategy=strategy, workers=2, epochs=1,
                             spark=spark, show_progress=False)
        out[strategy] = result.test_accuracy
    print("RESULT " + json.dumps(out))
""")


def _packed_env(tmp_path: Path) -> Path:
    """venv + the driver's versions of sparkdp's dependencies (pyspark comes from Spark itself on
    executors) + this checkout of sparkdp."""
    env = tmp_path / "env"
    # --copies: Spark 4 unpacks archives with Hadoop's FileUtil, which refuses symlinks leading out of
    # the archive ("expanding bin/python3.11 would create entry outside of ..."), and a plain venv's
    # bin/python is one, to the base interpreter
    subprocess.run([BARE_PYTHON, "-m", "venv", "--copies", str(env)], check=True, timeout=120)
    pins = [
        f"{name}=={version(name).split('+')[0]}"
        for name in (
            "torch",
            "numpy",
            "pyarrow",
            "pandas",
            "rich",
            "pyyaml",
            "psutil",
            "safetensors",
            "pillow",
            "matplotlib",
        )
    ]
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, *pins, "venv-pack"], check=True, timeout=900)
    subprocess.run([*pip, "--no-deps", str(ROOT)], check=True, timeout=300)
    # zip: Spark 4 untars in Java and drops the files' modes (bin/python is then "Permission denied");
    # its unzip keeps them
    archive = tmp_path / "env.zip"
    subprocess.run(
        [str(env / "bin" / "venv-pack"), "-p", str(env), "-o", str(archive), "-q"], check=True, timeout=600
    )
    return archive


@needs_fashion
def test_a_venv_pack_archive_trains_on_executors_without_sparkdp(tmp_path):
    bare = subprocess.run([BARE_PYTHON, "-c", "import torch"], capture_output=True, timeout=60)
    if bare.returncode == 0:
        pytest.skip(f"{BARE_PYTHON} has torch: no executor Python without it to test against")
    archive = _packed_env(tmp_path)
    (tmp_path / "cluster").mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1).start()
    try:
        base = {**cluster.env(), "PYSPARK_DRIVER_PYTHON": sys.executable}
        without = subprocess.run(
            [sys.executable, "-c", JOB, cluster.master_url],
            capture_output=True,
            text=True,
            timeout=300,
            env={**base, "PYSPARK_PYTHON": BARE_PYTHON},
            cwd=tmp_path,
        )
        shipped = subprocess.run(
            [sys.executable, "-c", JOB, cluster.master_url, str(archive)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**base, "PYSPARK_PYTHON": "./env/bin/python"},
            cwd=tmp_path,
        )
    finally:
        cluster.stop()
    assert without.returncode != 0
    assert "EnvironmentProblem" in without.stderr and "could not import" in without.stderr, without.stderr[
        -3000:
    ]
    assert "spark.archives" in without.stderr, without.stderr[-3000:]  # says what to do
    assert f"Python ({BARE_PYTHON}) does not have" in without.stderr, without.stderr[
        -3000:
    ]  # and which Python
    assert shipped.returncode == 0, shipped.stderr[-4000:]
    out = json.loads(next(line for line in shipped.stdout.splitlines() if line.startswith("RESULT "))[7:])
    work = str(tmp_path / "cluster" / "work")
    for executor in out["executors"]:  # the archive's copies, unpacked in the executor's work directory
        assert executor["python"].startswith(work) and "/env/bin/python" in executor["python"], executor
        assert executor["sparkdp"].startswith(work) and executor["torch"].startswith(work), executor
        assert not executor["sparkdp"].startswith(str(ROOT)), executor
    assert out["allreduce"] > 0.5 and out["asgd"] > 0.5, out
    assert os.path.getsize(archive) > 100e6  # torch really went with it
