"""The checkpoint store: one name matcher for every kind, directory checkpoints committed by a
manifest written last, and the background writer (one write in flight, errors never lost)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch

from sparkdp.train.checkpoint_store import (
    LOOP_PART,
    BackgroundWriter,
    CheckpointStore,
    host_copy,
    parse_name,
)
from sparkdp.train.sharded_checkpoint import shard_part

pytestmark = pytest.mark.timeout(60)
R0, R1 = shard_part(0), shard_part(1)  # the parts ranks 0 and 1 of a sharded checkpoint write


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
        writer.write(R0, b"zero")
        assert store.names() == []  # parts written, nothing committed yet
        writer.write(R1, b"one")
    assert store.names() == ["shards-e00001-s00000000-job.manifest.json"]
    assert store.read_directory(store.names()[0]) == {R0: b"zero", R1: b"one"}
    with pytest.raises(RuntimeError), store.directory_checkpoint("shards", "e00002-s00000000") as writer:
        writer.write(R0, b"zero")
        raise RuntimeError("rank 1 failed")
    assert store.names() == ["shards-e00001-s00000000-job.manifest.json"]
    assert not (tmp_path / "shards-e00002-s00000000-job").exists()  # the failed one's parts are gone
    (tmp_path / "shards-e00001-s00000000-job" / R1).write_bytes(b"One")
    with pytest.raises(ValueError, match="shard-00002-model-00001-of-00001.safetensors does not match"):
        store.read_directory("shards-e00001-s00000000-job.manifest.json")
    with store.directory_checkpoint("shards", "e00003-s00000000") as writer:
        writer.write(R0, b"three")
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
        store.directory_writer("shards", "e00001-s00000000").write(shard_part(rank), b"x" * (rank + 1))
    assert ranks[0].names() == []  # nothing listed before the commit
    import hashlib

    parts = {shard_part(r): hashlib.sha256(b"x" * (r + 1)).hexdigest() for r in range(2)}
    name = ranks[0].commit_directory("shards", "e00001-s00000000", parts)
    assert ranks[1].read_part(name, R1) == b"xx"
    with pytest.raises(ValueError, match=f"lists no part '{shard_part(2)}'"):
        ranks[1].read_part(name, shard_part(2))


def test_rotation_removes_this_jobs_older_directory_checkpoints_and_uncommitted_ones_only(tmp_path):
    mine, other = (
        CheckpointStore(str(tmp_path), "mine", keep=2),
        CheckpointStore(str(tmp_path), "other", keep=1),
    )
    with other.directory_checkpoint("shards", "e00001-s00000000") as writer:
        writer.write(LOOP_PART, b"theirs")
    other.directory_writer("shards", "e00002-s00000000").write(LOOP_PART, b"theirs, never committed")
    mine.directory_writer("shards", "e00000-s00000005").write(LOOP_PART, b"mine, never committed")
    for epoch in (1, 2, 3):
        with mine.directory_checkpoint("shards", f"e{epoch:05d}-s00000000") as writer:
            writer.write(LOOP_PART, b"mine")
    mine.directory_writer("shards", "e00004-s00000000").write(LOOP_PART, b"mine, being written")
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


def _sharded(directory, epoch: int, keep: int = 3) -> str:
    """A committed sharded checkpoint at the end of ``epoch`` as the loop writes it: a real
    loop-state part and one shard part."""
    from sparkdp.train.checkpoint import checkpoint_payload
    from sparkdp.train.checkpoint_store import encode, sync_position

    store = CheckpointStore(str(directory), "job", keep)
    payload = checkpoint_payload(
        epoch=epoch,
        step=0,
        model={},
        optimizer=b"\x01",
        strategy_state={},
        rng=[],
        history=[{"epoch": epoch, "loss": 1.0 / epoch}],
        workers=1,
    )
    with store.directory_checkpoint("shards", sync_position(epoch, 0)) as writer:
        writer.write(LOOP_PART, encode(payload, "job", "shards"))
        writer.write(R0, b"rank 0's shards")
    return store.name("shards", sync_position(epoch, 0))


def test_a_manifest_naming_a_part_outside_its_checkpoint_is_refused_and_the_one_before_resumed(
    tmp_path, caplog
):
    """An absolute and a ``../`` part name, each with a matching SHA-256: the manifest is refused
    on read with one warning line naming the part, the previous checkpoint is resumed, and the
    hostile part is neither read nor written anywhere."""
    from sparkdp.train.checkpoint import latest_checkpoint
    from tests.helpers.manifests import plant_hostile_parts

    directory, outside = tmp_path / "ckpts", tmp_path / "outside"
    _sharded(directory, 1)
    newest = _sharded(directory, 2)
    assert latest_checkpoint(directory).epoch == 2
    planted = plant_hostile_parts(directory / newest, outside, tmp_path)
    store = CheckpointStore(str(directory), "reader")
    with pytest.raises(ValueError, match=r"the part '(/|\.\./)\S*planted"):
        store.manifest(newest)
    with pytest.raises(ValueError, match="is not one of a shards checkpoint's"):
        store.read_part(newest, "../planted-up.pth", {"parts": {"../planted-up.pth": "0" * 64}})
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        found = latest_checkpoint(directory)
    assert found is not None and found.epoch == 1 and found.history == [{"epoch": 1, "loss": 1.0}]
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "\n" not in line and newest in line and "planted" in line and "trying the one before it" in line
    assert not any(p.exists() for p in planted)


@pytest.mark.parametrize(
    "part",
    [
        "",
        ".",
        "..",
        "../loop-state",
        "/etc/passwd",
        "a/loop-state",
        "loop-state/",
        "loop-state\n",
        "shard-1-model-00001-of-00001.safetensors",
        "shard-00001-model-00001-of-00001.safetensors/..",
        "C:\\loop-state",
        "shard-00001-model-00001-of-00001.safetensors\x00",
    ],
)
def test_part_names_outside_the_format_are_refused_when_written_and_when_read(tmp_path, part):
    import hashlib
    import json

    store = CheckpointStore(str(tmp_path), "job")
    with pytest.raises(ValueError, match="is not one of a shards checkpoint's"):
        store.directory_writer("shards", "e00001-s00000000").write(part, b"x")
    with pytest.raises(ValueError, match="is not one of a shards checkpoint's"):
        store.commit_directory("shards", "e00001-s00000000", {part: hashlib.sha256(b"x").hexdigest()})
    name = _sharded(tmp_path, 1)
    record = json.loads((tmp_path / name).read_text())
    record["parts"][part] = hashlib.sha256(b"x").hexdigest()
    (tmp_path / name).write_text(json.dumps(record))
    with pytest.raises(ValueError, match="is not one of a shards checkpoint's"):
        store.manifest(name)


@pytest.mark.parametrize("part", ["../planted", "/tmp/planted-by-a-manifest", "a/../../planted"])
def test_copying_parts_refuses_a_name_that_leaves_the_directory_even_past_the_store(tmp_path, part):
    # the second line of defence: a manifest that reached copy_parts without the store's check
    from sparkdp.train.sharded_checkpoint import copy_parts

    class Store:
        def read_part(self, name, part, manifest):
            return b"planted"

    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(ValueError, match="leaves the checkpoint"):
        copy_parts(Store(), "shards-e00001", {"parts": {part: "0" * 64}}, str(into))  # type: ignore[arg-type]
    assert not (tmp_path / "planted").exists() and not Path("/tmp/planted-by-a-manifest").exists()


@pytest.mark.parametrize("sha", ["", "0" * 63, "0" * 65, "G" * 64, "A" * 64, 7, None])
def test_a_manifest_digest_that_is_no_sha256_is_refused(tmp_path, sha):
    import json

    name = _sharded(tmp_path, 1)
    record = json.loads((tmp_path / name).read_text())
    record["parts"][R0] = sha
    (tmp_path / name).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"gives the part {R0} no SHA-256"):
        CheckpointStore(str(tmp_path), "reader").manifest(name)


@pytest.mark.parametrize(
    ("series", "before", "after"),
    [
        ("ckpt", "e99999-s00000007", "e100000-s00000000"),  # epoch 10^5
        ("ckpt", "e00003-s99999999", "e00003-s100000000"),  # step 10^8
        ("ps", "999999", "1000000"),  # the 10^6th server checkpoint... and the one after it
        ("ps-s0of2", "999999", "1000000"),
    ],
)
def test_positions_past_the_names_widths_are_listed_ordered_resumed_and_rotated(
    tmp_path, series, before, after
):
    """Names are written with minimum widths, so a position past them has a longer name: it is
    listed, sorts after the shorter one by number (not by text, where "e1..." < "e9..."), is the
    one resumed, and rotation keeps it and deletes the older ones."""
    store = CheckpointStore(str(tmp_path), "job", keep=2)
    first = store.save(
        series, "000002" if series.startswith("ps") else "e00002-s00000000", {"w": torch.zeros(1)}
    )
    older = store.save(series, before, {"w": torch.ones(1)})
    newest = store.save(series, after, {"w": torch.full((1,), 2.0)})
    assert after in newest and parse_name(newest) is not None and str(parse_name(newest)) == newest
    assert store.names(series) == [older, newest]  # keep=2: the oldest went, the newest stayed
    assert not (tmp_path / first).exists()
    found = store.latest(series, "job", lambda name, payload: payload)
    assert found is not None and found[0] == newest and torch.equal(found[1]["w"], torch.full((1,), 2.0))


def test_a_sharded_checkpoint_past_the_widths_is_the_one_resumed_and_uncommitted_ones_before_it_go(tmp_path):
    from sparkdp.train.checkpoint import latest_checkpoint

    store = CheckpointStore(str(tmp_path), "job", keep=1)
    store.directory_writer("shards", "e99998-s00000000").write(LOOP_PART, b"never committed")
    old = _sharded(tmp_path, 99_999, keep=1)
    new = _sharded(tmp_path, 100_000, keep=1)
    assert store.names() == [new] and not (tmp_path / old).exists()
    assert not (tmp_path / "shards-e99998-s00000000-job").exists()
    assert latest_checkpoint(tmp_path).epoch == 100_000


@pytest.mark.parametrize(
    "name",
    [
        "ckpt-e000001-s00000000-job.safetensors",  # a second text for epoch 1
        "ckpt-e00001-s000000001-job.safetensors",
        "ps-0000001-job.safetensors",
        "ps-01000000-job.safetensors",
        "ckpt-e00001-s00000000-job.safetensors\n",
    ],
)
def test_a_position_has_one_name_only(name):
    assert parse_name(name) is None


def _check_writable_many(directory: str, calls: int) -> list[str]:
    """``check_writable`` ``calls`` times, each through a new store (as each job has its own):
    the errors it raised."""
    from sparkdp.errors import ConfigError

    errors = []
    for _ in range(calls):
        try:
            CheckpointStore(directory, "reader").check_writable()
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


@pytest.mark.timeout(120)
def test_jobs_checking_one_directory_at_once_never_fail_each_other(tmp_path):
    """Threads and processes checking one directory at once, as jobs starting together do: no
    false "cannot write checkpoints", and no probe left behind."""
    import multiprocessing
    from concurrent.futures import ThreadPoolExecutor

    directory = str(tmp_path / "ckpts")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        processes = pool.starmap_async(_check_writable_many, [(directory, 150)] * 2)
        with ThreadPoolExecutor(6) as threads:
            errors = [
                e for found in threads.map(_check_writable_many, [directory] * 6, [150] * 6) for e in found
            ]
        errors += [e for found in processes.get(timeout=100) for e in found]
    assert errors == []
    assert list((tmp_path / "ckpts").iterdir()) == []


def test_a_directory_that_cannot_be_written_is_still_refused(tmp_path):
    from sparkdp.errors import ConfigError

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write checkpoints to .*leave checkpoint_dir unset"):
        CheckpointStore(str(blocker / "ckpts"), "reader").check_writable()
