"""Checkpoints in an S3 bucket: a real S3-compatible server (moto's, started for this module),
reached through fsspec with ``checkpoint_storage_options``. The store writes, lists, rotates
and commits directory checkpoints there; a real ``fit`` saves to ``s3://`` and a second one
resumes from it on the same trajectory as an uninterrupted run."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

import sparkdp
from sparkdp.train.checkpoint import checkpoint_names, latest_checkpoint
from sparkdp.train.checkpoint_store import LOOP_PART, CheckpointStore

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytestmark = pytest.mark.timeout(180)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(request):
    """``checkpoint_storage_options`` for a moto S3 server on 127.0.0.1, with one bucket."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def stop() -> None:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    request.addfinalizer(stop)  # also when the start below fails
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the moto S3 server did not start on {url}") from None
            time.sleep(0.2)
    options = {
        "endpoint_url": url,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    import boto3

    boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="ckpts")
    return options


def test_the_store_writes_rotates_and_commits_in_a_bucket(s3):
    store = CheckpointStore("s3://ckpts/store", "job-a", keep=2, storage_options=s3)
    store.check_writable()
    other = CheckpointStore("s3://ckpts/store", "job-b", keep=1, storage_options=s3)
    other.save("ps", "000000", {"w": torch.full((3,), -1.0)})
    for n in range(3):
        store.save("ps", f"{n:06d}", {"w": torch.full((3,), float(n))})
    other.save("ps", "000001", {"w": torch.full((3,), -2.0)})
    keys = sorted(k.rsplit("/", 1)[-1] for k in store.fs.ls("ckpts/store", refresh=True))
    assert keys == [
        "ps-000001-job-a.safetensors",
        "ps-000001-job-b.safetensors",
        "ps-000002-job-a.safetensors",
    ]
    found = store.latest("ps", "job-a", lambda name, payload: payload)
    assert found is not None and found[0] == "ps-000002-job-a.safetensors"
    assert torch.equal(found[1]["w"], torch.full((3,), 2.0))
    with store.directory_checkpoint("shards", "e00001-s00000000") as writer:
        writer.write(LOOP_PART, b"zero")
        assert "shards-e00001-s00000000-job-a.manifest.json" not in store.names()
    assert store.read_directory("shards-e00001-s00000000-job-a.manifest.json") == {LOOP_PART: b"zero"}


def test_a_fit_saves_to_a_bucket_and_a_second_fit_resumes_from_it(spark, s3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()

    def fit(epochs, **kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        return sparkdp.fit(
            model,
            (x, y),
            workers=2,
            epochs=epochs,
            batch_size=16,
            spark=spark,
            optimizer_options={"lr": 0.1, "momentum": 0.9},
            show_progress=False,
            checkpoint_storage_options=s3,
            **kw,
        )

    fit(2, checkpoint_dir="s3://ckpts/run", checkpoint_every=4)
    names = checkpoint_names("s3://ckpts/run", _settings(s3))
    assert len(names) == 3 and names[-1].startswith("ckpt-e00002-s00000000-"), names  # keep 3: the newest
    saved = latest_checkpoint("s3://ckpts/run", settings=_settings(s3))
    assert saved is not None and (saved.epoch, saved.step) == (2, 0)
    resumed = fit(3, resume="s3://ckpts/run")
    longer = fit(3)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]
    for (k, a), b in zip(longer.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=k)
    assert len(checkpoint_names("s3://ckpts/run", _settings(s3))) == 3  # the resumed job rotated its own


def _settings(options):
    from sparkdp.config import CheckpointConfig

    return CheckpointConfig(checkpoint_storage_options=options)
