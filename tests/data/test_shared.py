"""In-memory data shared with same-machine workers through memory-mapped files."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest
import torch
from pyspark import cloudpickle

from sparkdp.data import shared
from sparkdp.data.shared import MappedTensor, SharedTensorDir, shared_with_workers
from sparkdp.data.tensors import TensorData
from sparkdp.errors import DataError


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.int64, torch.bfloat16, torch.float64])
def test_a_mapped_tensor_reads_back_exactly(tmp_path, dtype):
    original = (torch.arange(3 * 5 * 7) - 40).reshape(3, 5, 7).to(dtype)
    store = SharedTensorDir(base=tmp_path)
    handle = store.share(original[:, 1:4])  # a non-contiguous view is written contiguously
    loaded = pickle.loads(pickle.dumps(handle)).load()
    assert loaded.dtype == dtype and loaded.shape == (3, 3, 7)
    assert torch.equal(loaded, original[:, 1:4])
    loaded.add_(1)  # copy-on-write: the file (and every other reader) keeps the original
    assert torch.equal(handle.load(), original[:, 1:4])
    store.close()
    assert not store.path.exists()


def test_shared_tensor_data_pickles_as_handles_and_yields_the_same_batches(tmp_path):
    gen = torch.Generator().manual_seed(3)
    data = TensorData(
        torch.randint(0, 256, (600, 1, 8, 8), generator=gen, dtype=torch.uint8),
        torch.randint(0, 10, (600,), generator=gen),
        divisor=255.0,
    )
    store = SharedTensorDir(base=tmp_path)
    blob = cloudpickle.dumps(data.shared(store))
    assert len(blob) < 2000 < len(cloudpickle.dumps(data))  # paths and shapes, not the 38 kB of rows
    remote = cloudpickle.loads(blob)
    assert remote.divisor == 255.0 and remote.num_samples() == 600
    for rank in (0, 1):
        mine = list(data.batches(rank=rank, world_size=2, epoch=1, batch_size=64, seed=5))
        theirs = list(remote.batches(rank=rank, world_size=2, epoch=1, batch_size=64, seed=5))
        assert len(mine) == len(theirs) == 5
        for (x1, y1), (x2, y2) in zip(mine, theirs):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    store.close()


@pytest.mark.parametrize("labels", [None, torch.arange(600)])
def test_a_shared_data_dict_pickles_as_handles_and_yields_the_same_dict_batches(tmp_path, labels):
    from sparkdp.data.tensors import DictData

    gen = torch.Generator().manual_seed(4)
    data = DictData(
        {
            "input_ids": torch.randint(0, 50, (600, 16), generator=gen),
            "attention_mask": torch.ones(600, 16, dtype=torch.int64),
        },
        labels,
    )
    store = SharedTensorDir(base=tmp_path)
    blob = cloudpickle.dumps(data.shared(store))
    assert len(blob) < 2000 < len(cloudpickle.dumps(data))
    remote = cloudpickle.loads(blob)
    mine = list(data.batches(rank=1, world_size=2, epoch=1, batch_size=64, seed=5))
    theirs = list(remote.batches(rank=1, world_size=2, epoch=1, batch_size=64, seed=5))
    assert len(mine) == len(theirs) == 5
    for (x1, y1), (x2, y2) in zip(mine, theirs):
        assert x1.keys() == x2.keys() and all(torch.equal(x1[k], x2[k]) for k in x1)
        assert (y1 is None and y2 is None) or torch.equal(y1, y2)
    store.close()


def test_unshared_tensor_data_still_pickles_its_rows():
    data = TensorData(torch.ones(4, 2), torch.zeros(4, dtype=torch.long))
    back = pickle.loads(pickle.dumps(data))
    assert torch.equal(back.features, data.features) and torch.equal(back.labels, data.labels)


def test_sharing_is_skipped_when_disabled_or_small(tmp_path, monkeypatch):
    big = TensorData(torch.zeros(300_000), torch.zeros(300_000, dtype=torch.long))  # 3.6 MB
    small = TensorData(torch.zeros(10), torch.zeros(10, dtype=torch.long))
    with shared_with_workers(False, big, None) as (train, test):
        assert train is big and test is None
    with shared_with_workers(True, small, small) as (train, test):
        assert train is small and test is small
    monkeypatch.setattr(shared, "_default_base", lambda expected: tmp_path)
    with shared_with_workers(True, big, None, "not tensor data") as (train, test, other):
        assert (
            train is not big and "_handles" in train.__dict__ and test is None and other == "not tensor data"
        )
        assert len(list(tmp_path.glob("sparkdp-data-*/*.bin"))) == 2
    assert not list(tmp_path.glob("sparkdp-data-*"))


def test_the_files_are_removed_when_the_job_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, "_default_base", lambda expected: tmp_path)
    big = TensorData(torch.zeros(300_000), torch.zeros(300_000, dtype=torch.long))
    with pytest.raises(RuntimeError, match="job failed"):
        with shared_with_workers(True, big):
            assert list(tmp_path.glob("sparkdp-data-*"))
            raise RuntimeError("job failed")
    assert not list(tmp_path.glob("sparkdp-data-*"))


def test_directories_of_dead_drivers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    orphan = tmp_path / f"sparkdp-data-{dead.stdout.strip()}-abc"
    orphan.mkdir()
    (orphan / "t0.bin").write_bytes(b"x")
    (orphan / shared.LOCK_FILE).touch()  # its owner's lock went with the owner
    unlocked = tmp_path / f"sparkdp-data-{dead.stdout.strip()}-def"  # being created, or not sparkdp's
    unlocked.mkdir()
    unrelated = tmp_path / "sparkdp-data-notapid"
    unrelated.mkdir()
    store = SharedTensorDir(base=tmp_path)
    assert not orphan.exists() and unlocked.exists() and unrelated.exists()
    assert store.path.stat().st_mode & 0o777 == 0o700  # private to this user
    store.close()


def test_memory_is_used_when_there_is_room_else_the_temp_dir():
    import tempfile

    assert shared._default_base(1 << 60) == shared.Path(tempfile.gettempdir())
    if shared._SHM.is_dir() and os.access(shared._SHM, os.W_OK):
        assert shared._default_base(1) == shared._SHM


def test_a_worker_that_cannot_read_the_file_says_why(tmp_path):
    handle = MappedTensor(str(tmp_path / "gone.bin"), "float32", (4, 2))
    with pytest.raises(DataError, match=r"cannot read the training data the driver shared.*local\[N\]"):
        handle.load()


_OWNER = """
import fcntl, os, sys
directory = sys.argv[1]
os.mkdir(directory)
fd = os.open(os.path.join(directory, sys.argv[2]), os.O_CREAT | os.O_RDWR, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()  # holds the lock until the test closes stdin
"""


@pytest.mark.timeout(60)
def test_a_directory_whose_owner_runs_in_another_pid_namespace_is_kept(tmp_path):
    """Its name carries a process id that means nothing here (the owner is in another container
    sharing /dev/shm): the owner's lock, not the id, says it is alive. Once the owner is gone,
    the next driver removes it."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    live = tmp_path / f"sparkdp-data-{dead}-elsewhere"
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(live), shared.LOCK_FILE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout.readline() == "ready\n"
        (live / "t0.bin").write_bytes(b"x")
        SharedTensorDir(base=tmp_path).close()
        assert (live / "t0.bin").exists()
    finally:
        owner.stdin.close()
        owner.wait(10)
    SharedTensorDir(base=tmp_path).close()
    assert not live.exists()


@pytest.mark.timeout(60)
def test_the_lock_holds_across_a_real_pid_namespace(tmp_path):
    """An OwnedDirectory made by a process in its own PID namespace (``unshare --pid``; the id in its
    name is that namespace's) is kept while that process runs and removed after."""
    import shutil as sh

    probe = (
        subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
        if sh.which("unshare")
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot create a PID namespace here (needs unshare and the right to use it)")
    src = os.path.dirname(os.path.dirname(os.path.dirname(shared.__file__)))  # the sparkdp under test
    code = (
        "import sys; from pathlib import Path; from sparkdp.data.shared import OwnedDirectory; "
        "d = OwnedDirectory(Path(sys.argv[1]), 'sparkdp-data-'); print(d.path, flush=True); sys.stdin.read()"
    )
    owner = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", code, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": src},
    )
    try:
        made = tmp_path / os.path.basename(owner.stdout.readline().strip())
        assert made.name.startswith("sparkdp-data-") and made.is_dir()
        SharedTensorDir(base=tmp_path).close()
        assert made.is_dir()
    finally:
        owner.stdin.close()
        owner.wait(10)
    SharedTensorDir(base=tmp_path).close()
    assert not made.exists()
