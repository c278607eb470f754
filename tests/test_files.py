"""The one atomic write: all or nothing, no temporary file left, the old file's mode kept."""

import os

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
    fresh = atomic_write(tmp_path / "sub" / "a.json", lambda tmp: open(tmp, "w").write("{}"))
    assert fresh.read_text() == "{}" and fresh.stat().st_mode & 0o777 == 0o644
    os.chmod(fresh, 0o600)
    atomic_write(fresh, lambda tmp: open(tmp, "w").write("[]"))
    assert fresh.read_text() == "[]" and fresh.stat().st_mode & 0o777 == 0o600
