"""The one checkpoint store: names, job identity, digest, atomic commit, rotation, background writes.

Every checkpoint sparkdp writes goes through a :class:`CheckpointStore`: a synchronous job's
states (``train.checkpoint``), the parameter server's on the driver and the ``servers=K``
servers' on the executors (``driver.async_job``), and states that are a directory of files
(per-rank shards; :meth:`CheckpointStore.directory_checkpoint`).

Names (one matcher, :func:`parse_name`): ``{series}-{position}-{job}{suffix}``, where
``series`` is ``ckpt`` (a synchronous state, position ``e{epoch:05d}-s{step:08d}``), ``ps``
(the driver's server, position ``{n:06d}``), ``ps-s{K}of{N}`` (server task K of N, ``{n:06d}``)
or ``shards`` (a directory checkpoint, ``e{epoch:05d}-s{step:08d}``); ``job`` is the identity of
the job that wrote it, so two jobs never write the same name, and ``suffix`` is
``.safetensors`` (one file) or ``.manifest.json`` (the commit record of a directory
checkpoint). The widths are minimums: epoch 100000 is ``e100000``. Names of one series sort by
the numbers of their position (:attr:`CheckpointName.key`), not by their text.

A directory checkpoint's manifest names its parts; a part name becomes a path when the part is
read, so every read checks each name against the parts its series' format defines
(:func:`check_part`: no separator, no ``..``, no absolute name can match) and each SHA-256 for
its form, before anything is read or written.

A one-file checkpoint is safetensors (``sparkdp.state``: nothing executes code on load) whose
JSON skeleton carries the job identity and the series, with one SHA-256 over the skeleton and
every tensor's name, dtype, shape and bytes (:func:`digest`). The directory is a local path or
any fsspec URL (``s3://``, ``gs://``, ``hdfs://``...; options through
``checkpoint_storage_options``). What is atomic where: docs/guide/reliability.md, Checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .. import state as state_io
from ..config import JOB_ID
from ..errors import ConfigError
from ..files import atomic_write

log = logging.getLogger(__name__)

#: the series a name may carry: synchronous, driver server, server task K of N, directory checkpoints
_SERIES = r"ckpt|ps|ps-s\d{1,4}of\d{1,4}|shards"


def _number(width: int) -> str:
    """A number written ``{n:0{width}d}``: exactly ``width`` digits, or more without a leading zero
    (one text per number, so two names never stand for one position)."""
    return rf"(?:\d{{{width}}}|[1-9]\d{{{width},}})"


_NAME = re.compile(
    rf"(?P<series>{_SERIES})-(?P<position>e{_number(5)}-s{_number(8)}|{_number(6)})-"
    rf"(?P<job>{JOB_ID.pattern})(?P<suffix>\.safetensors|\.manifest\.json)"
)
_SUFFIX = {"shards": ".manifest.json"}  # every other series is one .safetensors file
_MANIFEST_FORMAT = 1
#: the part of a sharded checkpoint that holds everything but the shards (train.checkpoint)
LOOP_PART = "loop-state"
#: the parts each directory series' format defines: a sharded checkpoint's loop state and one
#: DCP safetensors file per rank (train.sharded_checkpoint.shard_part)
_PARTS = {"shards": re.compile(rf"{LOOP_PART}|shard-{_number(5)}-model-00001-of-00001\.safetensors")}
_PARTS_SHOWN = {"shards": f"{LOOP_PART} or shard-NNNNN-model-00001-of-00001.safetensors"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def new_job_id() -> str:
    """A random identity for a job's checkpoints (kept across resumes of that job)."""
    return secrets.token_hex(8)


def position_key(position: str) -> tuple[int, ...]:
    """A position's numbers (epoch and step, or a server checkpoint's count), which order
    positions whatever their widths (``e100000`` after ``e99999``)."""
    return tuple(int(n) for n in re.findall(r"\d+", position))


@dataclass(frozen=True)
class CheckpointName:
    """A parsed checkpoint name; ordered by series, then position (oldest first)."""

    series: str
    position: str
    job_id: str
    suffix: str

    def __str__(self) -> str:
        return f"{self.series}-{self.position}-{self.job_id}{self.suffix}"

    @property
    def key(self) -> tuple[str, tuple[int, ...], str, str]:
        return self.series, position_key(self.position), self.job_id, self.suffix

    def __lt__(self, other: CheckpointName) -> bool:
        return self.key < other.key


def parse_name(name: str) -> CheckpointName | None:
    """The checkpoint ``name`` stands for, or None for anything that is not a checkpoint's name."""
    found = _NAME.fullmatch(name)
    if found is None:
        return None
    return CheckpointName(found["series"], found["position"], found["job"], found["suffix"])


def check_part(series: str, part: object) -> str:
    """``part`` if it is one of the part names ``series``' format defines; ``ValueError`` (one line,
    naming it) otherwise. Called wherever a part name is written or read, since a name from a
    manifest becomes a path: ``..``, an absolute name or a separator would reach outside the
    checkpoint, so only the format's own plain names pass."""
    allowed = _PARTS.get(series)
    if allowed is None:
        raise ValueError(f"the series {series!r} has no parts; directory checkpoints are {sorted(_PARTS)}")
    if not isinstance(part, str) or not allowed.fullmatch(part):
        raise ValueError(f"the part {part!r} is not one of a {series} checkpoint's ({_PARTS_SHOWN[series]})")
    return part


def sync_position(epoch: int, step: int) -> str:
    return f"e{epoch:05d}-s{step:08d}"


def server_series(shard: int | None = None, servers: int | None = None) -> str:
    """The driver's server (``ps``) or server task ``shard`` of ``servers`` (``ps-sKofN``)."""
    return "ps" if shard is None else f"ps-s{shard}of{servers}"


def digest(tensors: Mapping[str, torch.Tensor], skeleton: str) -> str:
    """SHA-256 of the skeleton and every tensor's name, dtype, shape and bytes (bytes alone would
    accept a float32 [4] read back as an int8 [16])."""
    h = hashlib.sha256(skeleton.encode())
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(f"|{tensors[name].dtype}|{list(tensors[name].shape)}|".encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().data)
    return h.hexdigest()


def encode(payload: Any, job_id: str, series: str) -> bytes:
    """``payload`` (nested state) as the bytes of a one-file checkpoint of ``job_id``."""
    skeleton, tensors = state_io.flatten({"job_id": job_id, "series": series, "state": payload})
    return st_save(tensors, metadata={state_io.META_KEY: skeleton, "sha256": digest(tensors, skeleton)})


def decode(data: bytes) -> tuple[str, str, Any]:
    """Verify a one-file checkpoint's bytes: (job identity, series, payload); ``ValueError`` for
    anything that is not an intact checkpoint."""
    try:
        meta = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")]).get("__metadata__") or {}
        tensors = st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"not a readable safetensors file ({exc})") from exc
    skeleton = meta.get(state_io.META_KEY) if isinstance(meta, dict) else None
    if not isinstance(skeleton, str) or meta.get("sha256") != digest(tensors, skeleton):
        raise ValueError("its SHA-256 does not match its contents (damaged or altered)")
    try:
        wrapper = state_io.unflatten(skeleton, tensors)
    except Exception as exc:  # a skeleton that is JSON but not sparkdp state's: damaged, like a bad digest
        raise ValueError(f"its contents are not a checkpoint's ({type(exc).__name__}: {exc})") from exc
    if (
        not isinstance(wrapper, dict)
        or not isinstance(wrapper.get("job_id"), str)
        or not isinstance(wrapper.get("series"), str)
        or "state" not in wrapper
    ):
        raise ValueError("its contents are not a checkpoint's (no job identity)")
    return wrapper["job_id"], wrapper["series"], wrapper["state"]


def host_copy(obj: Any) -> Any:
    """``obj`` with every tensor copied to host memory: what a background writer may read while
    training goes on changing the originals (dicts, lists and tuples are rebuilt, the rest kept)."""
    return HostSnapshot().take(obj)


class HostSnapshot:
    """Copies state into host buffers kept from one save to the next, so that a save pays for
    the copy only, not for allocating and first touching fresh memory (GPU tensors go to pinned
    buffers, all copies issued before one wait). The buffers a snapshot returns are overwritten
    by the next :meth:`take`: take it only once the previous snapshot's write is done."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    def take(self, obj: Any) -> Any:
        """``obj`` with every tensor copied (dicts, lists and tuples rebuilt, the rest kept)."""
        devices: set[torch.device] = set()
        copied = self._take(obj, (), devices)
        for device in devices:  # the non-blocking device-to-host copies have landed
            torch.cuda.synchronize(device)
        return copied

    def _take(self, obj: Any, path: tuple[Any, ...], devices: set[torch.device]) -> Any:
        if isinstance(obj, torch.Tensor):
            src = obj.detach()
            buf = self._buffers.get(path)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
                self._buffers[path] = buf
            buf.copy_(src, non_blocking=src.is_cuda)
            if src.is_cuda:
                devices.add(src.device)
            return buf
        if isinstance(obj, dict):
            return {k: self._take(v, (*path, k), devices) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._take(v, (*path, i), devices) for i, v in enumerate(obj))
        return obj


class CheckpointStore:
    """One job's checkpoints in ``directory`` (a local path or an fsspec URL).

    ``job_id`` names every file this store writes and is written inside it; :meth:`rotate` keeps
    the newest ``keep`` of this job's checkpoints of a series and never touches another job's."""

    def __init__(
        self, directory: str, job_id: str, keep: int = 3, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        if not JOB_ID.fullmatch(job_id):
            raise ConfigError(
                f"checkpoint job identity {job_id!r}: expected 1-64 letters, digits, '_' or '-'."
            )
        import fsspec

        self.directory, self.job_id, self.keep = str(directory), job_id, keep
        self.fs, root = fsspec.core.url_to_fs(self.directory, **dict(storage_options or {}))
        self.root = root.rstrip("/")
        self.local = "file" in _protocols(self.fs)

    # ------------------------------------------------------------------ names
    def url(self, name: str) -> str:
        """Where ``name`` is, as the user would write it (for messages and ``Checkpoint.path``)."""
        return (
            f"{self.directory.rstrip('/')}/{name}"
            if "://" in self.directory
            else str(Path(self.directory) / name)
        )

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def names(self, series: str | None = None, job_id: str | None = None) -> list[str]:
        """The committed checkpoints (of ``series``, of ``job_id``, when given), oldest first by
        series and position; an absent directory has none."""
        try:
            self.fs.invalidate_cache(self.root)  # object stores' listings are cached per instance
            entries = self.fs.ls(self.root, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        parsed = [
            p
            for p in (parse_name(str(e).rstrip("/").rsplit("/", 1)[-1]) for e in entries)
            if p is not None
            and (series is None or p.series == series)
            and (job_id is None or p.job_id == job_id)
            and p.suffix == _SUFFIX.get(p.series, ".safetensors")
        ]
        return [str(p) for p in sorted(parsed)]

    def name(self, series: str, position: str) -> str:
        return str(CheckpointName(series, position, self.job_id, _SUFFIX.get(series, ".safetensors")))

    # ------------------------------------------------------------------ one-file checkpoints
    def save(self, series: str, position: str, payload: Any) -> str:
        """Write ``payload`` as this job's checkpoint at ``position`` of ``series``, atomically,
        then rotate the series; returns its name."""
        name = self.name(series, position)
        self.put(name, encode(payload, self.job_id, series))
        self.rotate(series, name)
        return name

    def load(self, name: str) -> Any:
        """Read and verify one checkpoint's payload; ``ValueError`` if it is truncated, altered,
        not a checkpoint, or carries another identity than its name's."""
        parsed = parse_name(name)
        job, series, payload = decode(self.fs.cat_file(self._path(name)))
        if parsed is None or (job, series) != (parsed.job_id, parsed.series):
            raise ValueError(f"its contents are job {job!r}'s {series!r} checkpoint, not what its name says")
        return payload

    def latest(
        self, series: str, job_id: str | None, read: Callable[[str, Any], Any]
    ) -> tuple[str, Any] | None:
        """The newest checkpoint of ``series`` (of ``job_id`` only, when given) that reads, verifies
        and that ``read(name, payload)`` accepts (``ValueError``: damaged); damaged newer ones are
        skipped with a warning (a directory checkpoint's payload is its :meth:`manifest`).
        ``(name, read's result)`` or None."""
        for name in reversed(self.names(series, job_id)):
            try:
                payload = self.manifest(name) if name.endswith(".manifest.json") else self.load(name)
                return name, read(name, payload)
            except ConfigError:
                raise  # a checkpoint of another model or layout: the older ones are too
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping the checkpoint %s: %s; trying the one before it", self.url(name), exc)
        return None

    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name``, all or nothing: locally a temporary file renamed over it;
        elsewhere a temporary key, then the final key written last (listings see committed names
        only: a temporary name is not a checkpoint's)."""
        if self.local:
            atomic_write(self._path(name), lambda tmp: Path(tmp).write_bytes(data))
            return
        tmp = self._path(f".{name}.{secrets.token_hex(4)}.tmp")
        self.fs.pipe_file(tmp, data)
        try:
            self.fs.mv(tmp, self._path(name))
        finally:
            if self.fs.exists(tmp):
                self.fs.rm_file(tmp)

    # ------------------------------------------------------------------ directory checkpoints
    @contextmanager
    def directory_checkpoint(self, series: str, position: str) -> Iterator[DirectoryWriter]:
        """A checkpoint that is a directory of files written by this process: write the parts
        through the yielded writer; on a clean exit its manifest (every part's SHA-256, the job
        identity) is written last, as one atomic file, and only then is the checkpoint listed. An
        exception leaves no manifest, and the parts are removed. (Parts written by several
        processes: :meth:`directory_writer` in each, :meth:`commit_directory` in one.)"""
        writer = self.directory_writer(series, position)
        try:
            yield writer
        except BaseException:
            self._remove_tree(writer.directory)
            raise
        self.commit_directory(series, position, writer.parts)

    def directory_writer(self, series: str, position: str) -> DirectoryWriter:
        """A writer of parts of this job's directory checkpoint at ``position``; nothing is
        listed until :meth:`commit_directory`."""
        return DirectoryWriter(self, self.name(series, position).removesuffix(".manifest.json"), series)

    def commit_directory(self, series: str, position: str, parts: Mapping[str, str]) -> str:
        """Commit a directory checkpoint whose ``parts`` (part name -> SHA-256) are all written:
        its manifest is written, atomically, and the series rotated; returns its name."""
        name = self.name(series, position)
        for part in parts:
            check_part(series, part)
        manifest = {"format": _MANIFEST_FORMAT, "job_id": self.job_id, "series": series, "parts": dict(parts)}
        self.put(name, json.dumps(manifest, sort_keys=True).encode())
        self.rotate(series, name)
        return name

    def discard(self, series: str, position: str) -> None:
        """Remove this job's checkpoint at ``position`` of ``series`` and, for a directory
        checkpoint, any parts left there by a write that never committed (before writing it anew)."""
        name = self.name(series, position)
        if self.fs.exists(self._path(name)):
            self.delete(name)
        if name.endswith(".manifest.json"):
            self._remove_tree(name.removesuffix(".manifest.json"))

    def manifest(self, name: str) -> dict[str, Any]:
        """A committed directory checkpoint's manifest, checked against its name; ``ValueError``
        if it is not one."""
        parsed = parse_name(name)
        if parsed is None or parsed.series not in _PARTS:
            raise ValueError(f"{name!r} is not a directory checkpoint's name")
        try:
            manifest = json.loads(self.fs.cat_file(self._path(name)))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"its manifest is not JSON ({exc})") from exc
        if (
            not isinstance(manifest, dict)
            or manifest.get("format") != _MANIFEST_FORMAT
            or manifest.get("job_id") != parsed.job_id
            or manifest.get("series", parsed.series) != parsed.series
            or not isinstance(manifest.get("parts"), dict)
        ):
            raise ValueError("its manifest is not one of this checkpoint's")
        for part, sha in manifest["parts"].items():
            check_part(parsed.series, part)
            if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                raise ValueError(f"its manifest gives the part {part} no SHA-256 (64 hex digits) but {sha!r}")
        return manifest

    def read_part(self, name: str, part: str, manifest: Mapping[str, Any] | None = None) -> bytes:
        """One part of a committed directory checkpoint, checked against the SHA-256 its
        manifest gives; ``ValueError`` if it is not listed there or does not match."""
        manifest = self.manifest(name) if manifest is None else manifest
        check_part(_parsed(name).series, part)  # a name given here becomes a path too
        sha = manifest["parts"].get(part)
        if sha is None:
            raise ValueError(f"its manifest lists no part {part!r}")
        data = self.fs.cat_file(self._path(f"{name.removesuffix('.manifest.json')}/{part}"))
        if hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(
                f"its part {part} does not match the SHA-256 its manifest gives (damaged or altered)"
            )
        return data

    def read_directory(self, name: str) -> dict[str, bytes]:
        """Every part of a committed directory checkpoint, each checked against its manifest."""
        manifest = self.manifest(name)
        return {part: self.read_part(name, part, manifest) for part in manifest["parts"]}

    # ------------------------------------------------------------------ rotation
    def rotate(self, series: str, written: str) -> None:
        """Keep the newest ``keep`` of this job's ``series`` checkpoints up to the one just
        ``written``: the file just written is never deleted, nor a newer one, nor another job's.
        A directory series also loses this job's older directories that were never committed."""
        newest = _parsed(written)
        older = [n for n in self.names(series, self.job_id) if _parsed(n) < newest]
        for old in older[: max(len(older) - (self.keep - 1), 0)]:
            self.delete(old)
        for orphan in self._uncommitted(series, written):
            self._remove_tree(orphan)

    def _uncommitted(self, series: str, before: str) -> list[str]:
        """This job's directories of ``series`` older than ``before`` that have no manifest: the
        parts of a write that failed or was killed before its commit."""
        if _SUFFIX.get(series) != ".manifest.json":
            return []
        try:
            self.fs.invalidate_cache(self.root)
            entries = {str(e).rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.root, detail=False)}
        except (FileNotFoundError, NotADirectoryError):
            return []
        found, newest = [], _parsed(before)
        for entry in entries:
            parsed = parse_name(entry + ".manifest.json")
            if (
                parsed is not None
                and (parsed.series, parsed.job_id) == (series, self.job_id)
                and parsed < newest
                and str(parsed) not in entries
            ):
                found.append(entry)
        return sorted(found)

    def delete(self, name: str) -> None:
        """Remove a checkpoint (a directory checkpoint's manifest first: it stops being listed)."""
        try:
            self.fs.rm_file(self._path(name))
            if name.endswith(".manifest.json"):
                self._remove_tree(name.removesuffix(".manifest.json"))
        except OSError as exc:  # an old checkpoint left behind is not worth failing the job for
            log.warning("could not delete the old checkpoint %s: %s", self.url(name), exc)

    def _remove_tree(self, directory: str) -> None:
        path = self._path(directory)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def check_writable(self) -> None:
        """Fail at the start of a job, not after an hour of training, if nothing can be saved here.
        Each call writes and removes a probe of its own name: jobs starting on one directory at
        once never remove each other's probe (a hidden name, never a checkpoint's)."""
        probe = f".sparkdp-write-test-{secrets.token_hex(8)}"
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            try:
                self.put(probe, b"ok")
            finally:
                if self.fs.exists(self._path(probe)):
                    self.fs.rm_file(self._path(probe))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot write checkpoints to {self.directory!r}: {exc}. Give a directory this user "
                "can write (on a cluster, one the executors and the driver share), or leave "
                "checkpoint_dir unset."
            ) from exc


class DirectoryWriter:
    """The parts of a directory checkpoint being written (:meth:`CheckpointStore.directory_checkpoint`)."""

    def __init__(self, store: CheckpointStore, directory: str, series: str) -> None:
        self.store, self.directory, self.series = store, directory, series
        self.parts: dict[str, str] = {}  # part name -> SHA-256 of its bytes
        store.fs.makedirs(store._path(directory), exist_ok=True)

    @property
    def path(self) -> str:
        """The directory's own path on its filesystem (for writers that take a path, with ``fs``)."""
        return self.store._path(self.directory)

    def write(self, part: str, data: bytes) -> None:
        check_part(self.series, part)
        self.store.put(f"{self.directory}/{part}", data)
        self.parts[part] = hashlib.sha256(data).hexdigest()


def _parsed(name: str) -> CheckpointName:
    """A name this store listed or wrote (always a checkpoint's)."""
    parsed = parse_name(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a checkpoint's name")
    return parsed


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class BackgroundWriter:
    """Writes checkpoints on one background thread, so that training only pays for the snapshot.

    At most one write is in flight: :meth:`submit` waits for the previous one to finish before it
    starts the next (no save is dropped or merged). A write that failed is logged at once and
    raised by the next :meth:`submit` or by :meth:`close`, which waits for the last write."""

    def __init__(self, name: str = "sparkdp-checkpoint-writer") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, write: Callable[[], object]) -> None:
        """Run ``write()`` in the background, after the previous write (whose error it raises)."""
        self.wait()
        # not a daemon: a process that ends while a write is in flight finishes that write first
        self._thread = threading.Thread(target=self._run, args=(write,), name=self.name)
        self._thread.start()

    def wait(self) -> None:
        """Wait for the write in flight; raise its error, if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    close = wait

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self, write: Callable[[], object]) -> None:
        try:
            write()
        except BaseException as exc:  # kept for the training thread, which raises it
            log.error(
                "writing a checkpoint failed (%s: %s); the job stops at its next save or its end",
                type(exc).__name__,
                exc,
            )
            self._error = exc


__all__ = [
    "LOOP_PART",
    "BackgroundWriter",
    "CheckpointName",
    "CheckpointStore",
    "DirectoryWriter",
    "HostSnapshot",
    "decode",
    "digest",
    "encode",
    "host_copy",
    "new_job_id",
    "check_part",
    "parse_name",
    "position_key",
    "server_series",
    "sync_position",
]
