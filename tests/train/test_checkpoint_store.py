"""The checkpoint store: one name matcher for every kind, directory checkpoints committed by a
manifest written last, and the background writer (one write in flight, errors never lost)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from sparkdp.train.checkpoint_store import BackgroundWriter, CheckpointStore, host_copy, parse_name

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("ckpt-e00001-s00000020-0123abcd.safetensors", ("ckpt", "e00001-s00000020", "0123abcd")),
        ("ps-000003-job-a.safetensors", ("ps", "000003", "job-a")),
        ("ps-s1of2-000000-f00d.safetensors", ("ps-s1of2", "000000", "f00d")),
        ("shards-e00002-s00000000-abc.manifest.json", ("shards", "e00002-s00000000", "abc")),
    ],
)
def test_one_matcher_reads_every_kind(name, parts):
    parsed = parse_name(name)
    assert (
        parsed is not None
        and (parsed.series, parsed.position, parsed.job_id) == parts
        and str(parsed) == name
    )


@pytest.mark.parametrize(
    "name",
    [
        "ckpt-e00001-s00000020.safetensors",  # no identity
        "ps-000003.safetensors",
        "ps-s1of2-000000.safetensors",
        "ckpt-e1-s2-job.safetensors",
        ".ckpt-e00001-s00000020-job.safetensors.1a2b.tmp",
        "ps-000003-job.safetensors.tmp",
        "notes-000001-j.safetensors",
        "ps-000003-a/b.safetensors",
    ],
)
def test_what_is_not_a_checkpoint_name(name):
    assert parse_name(name) is None


def test_an_identity_that_cannot_be_part_of_a_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="letters, digits"):
        CheckpointStore(str(tmp_path), "a/b")


def test_a_directory_checkpoint_is_listed_only_once_its_manifest_is_written(tmp_path):
    store = CheckpointStore(str(tmp_path), "job", keep=1)
    with store.directory_checkpoint("shards", "e00001-s00000000") as writer:
        writer.write("rank0.distcp", b"zero")
        assert store.names() == []  # parts written, nothing committed yet
        writer.write("rank1.distcp", b"one")
    assert store.names() == ["shards-e00001-s00000000-job.manifest.json"]
    assert store.read_directory(store.names()[0]) == {"rank0.distcp": b"zero", "rank1.distcp": b"one"}
    with pytest.raises(RuntimeError), store.directory_checkpoint("shards", "e00002-s00000000") as writer:
        writer.write("rank0.distcp", b"zero")
        raise RuntimeError("rank 1 failed")
    assert store.names() == ["shards-e00001-s00000000-job.manifest.json"]
    assert not (tmp_path / "shards-e00002-s00000000-job").exists()  # the failed one's parts are gone
    (tmp_path / "shards-e00001-s00000000-job" / "rank1.distcp").write_bytes(b"One")
    with pytest.raises(ValueError, match="rank1.distcp does not match"):
        store.read_directory("shards-e00001-s00000000-job.manifest.json")
    with store.directory_checkpoint("shards", "e00003-s00000000") as writer:
        writer.write("rank0.distcp", b"three")
    # keep=1: the older checkpoint went, manifest and parts
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shards-e00003-s00000000-job",
        "shards-e00003-s00000000-job.manifest.json",
    ]


def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path), "job")
    name = store.save("ps", "000000", {"w": torch.ones(3)})
    before = (tmp_path / name).read_bytes()
    import sparkdp.train.checkpoint_store as module

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(module, "encode", lambda payload, job, series: b"half" + broken())
    with pytest.raises(OSError, match="disk full"):
        store.save("ps", "000000", {"w": torch.zeros(3)})
    assert (tmp_path / name).read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [name]


def test_the_snapshot_does_not_follow_later_changes():
    state = {"w": torch.ones(4), "groups": [{"lr": 0.1, "momentum": (torch.zeros(2),)}]}
    snap = host_copy(state)
    state["w"].add_(1)
    state["groups"][0]["momentum"][0].fill_(7)
    assert torch.equal(snap["w"], torch.ones(4)) and torch.equal(
        snap["groups"][0]["momentum"][0], torch.zeros(2)
    )
    assert snap["groups"][0]["lr"] == 0.1 and isinstance(snap["groups"][0]["momentum"], tuple)


def test_the_background_writer_keeps_one_write_in_flight():
    writer, release, order = BackgroundWriter(), threading.Event(), []

    def slow():
        assert release.wait(10)
        order.append("first")

    writer.submit(slow)
    assert writer.busy
    threading.Timer(0.2, release.set).start()
    writer.submit(lambda: order.append("second"))  # waits for the first
    assert order == ["first"] or order == ["first", "second"]
    writer.close()
    assert order == ["first", "second"] and not writer.busy


def test_a_failed_background_write_is_logged_and_raised_at_the_next_save_and_at_the_end(caplog):
    writer = BackgroundWriter()

    def fail():
        raise OSError("No space left on device")

    with caplog.at_level(logging.ERROR, logger="sparkdp"):
        writer.submit(fail)
        with pytest.raises(OSError, match="No space left"):
            writer.submit(lambda: None)  # the next save
    assert "writing a checkpoint failed (OSError: No space left on device)" in caplog.text
    writer.close()
    writer.submit(fail)
    with pytest.raises(OSError, match="No space left"):
        writer.close()  # the end of the job
    writer.close()  # raised once


def test_parts_written_by_several_processes_are_committed_by_one(tmp_path):
    """Each rank writes its parts through its own writer; one commit lists all of them, and
    each part reads back checked against its SHA-256."""
    ranks = [CheckpointStore(str(tmp_path), "job") for _ in range(2)]
    for rank, store in enumerate(ranks):
        store.directory_writer("shards", "e00001-s00000000").write(f"rank{rank}", b"x" * (rank + 1))
    assert ranks[0].names() == []  # nothing listed before the commit
    import hashlib

    parts = {f"rank{r}": hashlib.sha256(b"x" * (r + 1)).hexdigest() for r in range(2)}
    name = ranks[0].commit_directory("shards", "e00001-s00000000", parts)
    assert ranks[1].read_part(name, "rank1") == b"xx"
    with pytest.raises(ValueError, match="lists no part 'rank2'"):
        ranks[1].read_part(name, "rank2")


def test_rotation_removes_this_jobs_older_directory_checkpoints_and_uncommitted_ones_only(tmp_path):
    mine, other = (
        CheckpointStore(str(tmp_path), "mine", keep=2),
        CheckpointStore(str(tmp_path), "other", keep=1),
    )
    with other.directory_checkpoint("shards", "e00001-s00000000") as writer:
        writer.write("part", b"theirs")
    other.directory_writer("shards", "e00002-s00000000").write("part", b"theirs, never committed")
    mine.directory_writer("shards", "e00000-s00000005").write("part", b"mine, never committed")
    for epoch in (1, 2, 3):
        with mine.directory_checkpoint("shards", f"e{epoch:05d}-s00000000") as writer:
            writer.write("part", b"mine")
    mine.directory_writer("shards", "e00004-s00000000").write("part", b"mine, being written")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shards-e00001-s00000000-other",  # another job's, committed or not, stays
        "shards-e00001-s00000000-other.manifest.json",
        "shards-e00002-s00000000-mine",
        "shards-e00002-s00000000-mine.manifest.json",
        "shards-e00002-s00000000-other",
        "shards-e00003-s00000000-mine",
        "shards-e00003-s00000000-mine.manifest.json",
        "shards-e00004-s00000000-mine",  # newer than the last commit: a write in flight
    ]
    mine.discard("shards", "e00004-s00000000")  # what a save at that position does first
    mine.discard("shards", "e00003-s00000000")
    assert mine.names("shards", "mine") == ["shards-e00002-s00000000-mine.manifest.json"]
    assert not (tmp_path / "shards-e00004-s00000000-mine").exists()
