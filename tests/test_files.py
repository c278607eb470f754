"""The one atomic write: all or nothing, no temporary file left, the old file's mode kept, the umask
respected, the rename made durable."""

import os
import stat

import pytest

from sparkdp.files import atomic_write


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"good")

    def half_then_fail(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == b"good"
    assert os.listdir(tmp_path) == ["model.bin"]


def test_a_new_file_is_0644_and_a_replaced_one_keeps_its_mode(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = atomic_write(tmp_path / "sub" / "a.json", lambda tmp: open(tmp, "w").write("{}"))
    finally:
        os.umask(old)
    assert fresh.read_text() == "{}" and fresh.stat().st_mode & 0o777 == 0o644
    os.chmod(fresh, 0o600)
    atomic_write(fresh, lambda tmp: open(tmp, "w").write("[]"))
    assert fresh.read_text() == "[]" and fresh.stat().st_mode & 0o777 == 0o600


def test_a_new_file_follows_the_umask(tmp_path):
    """A user whose umask is 077 gets checkpoints nobody else can read (0644 was forced before)."""
    old = os.umask(0o077)
    try:
        private = atomic_write(tmp_path / "ckpt.safetensors", lambda tmp: open(tmp, "wb").write(b"x"))
        assert os.umask(0o077) == 0o077  # reading the umask did not change it
    finally:
        os.umask(old)
    assert private.stat().st_mode & 0o777 == 0o600


def test_the_directory_is_synced_after_the_rename(tmp_path, monkeypatch):
    """The rename is durable only once the directory is fsynced; the last fsync must be the directory's."""
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    atomic_write(tmp_path / "a.bin", lambda tmp: open(tmp, "wb").write(b"x"))
    assert synced == [False, True]  # the file's data, then its directory
