"""Training checkpoints: everything a synchronous job needs to continue where it stopped.

One checkpoint is one ``.safetensors`` file (``sparkdp.state``: tensors as safetensors entries,
the nesting around them as JSON metadata; nothing executes code on load) holding the model,
the optimizer and scheduler state, the strategy's state, every rank's RNG state, the position
in the data (epoch, steps done in it), the history so far and the identity of the job that
wrote it (``job_id``), plus a SHA-256 over its tensors' names, dtypes, shapes and bytes and the
JSON around them. How it is written (``sparkdp.files.atomic_write``), skipped when damaged,
rotated, and kept from other jobs (:func:`sparkdp.driver.recovery.refuse_foreign_checkpoints`):
see docs/guide/reliability.md, Checkpoints and One job per directory; what the digest does not
guard against: docs/guide/security.md, Files the job reads.

The directory is a local path (on a cluster: one every executor and the driver can reach) or a
pyarrow filesystem URL (``hdfs://...``, ``s3://...``); rank 0 writes, the driver reads.

Names sort by position: ``ckpt-e{epoch:05d}-s{step:08d}.safetensors``, ``epoch`` 0-based,
``step`` the optimizer steps done in that epoch (an epoch-end checkpoint is ``e{epoch+1}-s0``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .. import state as state_io
from ..config import check_int, check_seconds
from ..errors import ConfigError
from ..files import atomic_write

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-e(\d{5})-s(\d{8})\.safetensors$")
FORMAT = 1
_DIGEST_V2 = "v2"  # metadata["digest"]: the SHA-256 covers dtypes and shapes (files without it: bytes only)
_MAX_HEADER = 100 << 20  # a safetensors JSON header larger than this is not one of ours


def new_job_id() -> str:
    """A random identity for a job's checkpoints (kept across resumes of that job)."""
    return secrets.token_hex(8)


def lineage_of(checkpoint: Checkpoint) -> str:
    """The identity a job resuming from ``checkpoint`` writes its checkpoints under: the
    checkpoint's own, or for one written before checkpoints carried one, an identity derived from
    it, so that running the same resume again recognises the files its first run wrote."""
    if checkpoint.job_id:
        return checkpoint.job_id
    where = f"{checkpoint.path}|{checkpoint.epoch}|{checkpoint.step}".encode()
    return "resumed-" + hashlib.sha256(where).hexdigest()[:16]


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often a job saves checkpoints.

    Attributes:
        directory: a local directory or a pyarrow filesystem URL.
        every_steps: also save every this many optimizer steps (``None``: epoch ends only).
        every_seconds: also save when this many seconds passed since the last save.
        keep: how many checkpoints to keep (the newest; older ones are deleted).
        job_id: the identity written into every checkpoint; rotation deletes only files
            carrying it, and restarts resume only from them.
    """

    directory: str
    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 3
    job_id: str = field(default_factory=new_job_id)

    def __post_init__(self) -> None:
        check_int("checkpoint_every (steps)", self.every_steps, optional=True)
        check_seconds("checkpoint_every_s", self.every_seconds, optional=True)
        check_int("keep_checkpoints", self.keep)


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. ``epoch``/``step``: where training continues (0-based epoch)."""

    path: str
    epoch: int
    step: int
    model: dict[str, torch.Tensor]
    optimizer: bytes
    strategy_state: dict[str, Any]
    rng: list[torch.Tensor]
    history: list[dict[str, float]]
    workers: int
    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0)
    job_id: str = ""  # '' for a checkpoint written before checkpoints carried one


def _is_url(directory: str) -> bool:
    return "://" in str(directory)


def _filesystem(directory: str) -> tuple[Any, str]:
    from pyarrow import fs

    return fs.FileSystem.from_uri(str(directory))


def check_writable(directory: str | os.PathLike[str]) -> None:
    """Fail at the start of a job, not after an hour of training, if nothing can be saved there."""
    directory = os.fspath(directory)
    try:
        if _is_url(directory):
            filesystem, path = _filesystem(directory)
            filesystem.create_dir(path, recursive=True)
            probe = f"{path}/.sparkdp-write-test"
            with filesystem.open_output_stream(probe) as out:
                out.write(b"ok")
            filesystem.delete_file(probe)
        else:
            Path(directory).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(directory) / ".sparkdp-write-test", lambda tmp: Path(tmp).write_bytes(b"ok"))
            (Path(directory) / ".sparkdp-write-test").unlink()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot write checkpoints to {directory!r}: {exc}. Give a directory this user can "
                          "write (on a cluster, one the executors and the driver share), or leave "
                          "checkpoint_dir unset.") from exc


def checkpoint_names(directory: str | os.PathLike[str]) -> list[str]:
    """The checkpoint files in ``directory``, oldest first (an absent directory has none)."""
    directory = os.fspath(directory)
    if _is_url(directory):
        from pyarrow import fs

        filesystem, path = _filesystem(directory)
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
        names = [Path(i.path).name for i in infos]
    else:
        names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(n for n in names if _NAME.match(n))


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}" if _is_url(directory) else str(Path(directory) / name)


def _digest(tensors: dict[str, torch.Tensor], skeleton: str, version: str | None = _DIGEST_V2) -> str:
    """SHA-256 of the skeleton and every tensor; ``v2`` also hashes each tensor's dtype and shape
    (bytes alone would accept a float32 [4] read back as an int8 [16])."""
    h = hashlib.sha256(skeleton.encode())
    for name in sorted(tensors):
        h.update(name.encode())
        if version == _DIGEST_V2:
            h.update(f"|{tensors[name].dtype}|{list(tensors[name].shape)}|".encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _header_metadata(directory: str, name: str) -> dict[str, str] | None:
    """The safetensors metadata of a checkpoint file, reading only its header; None if unreadable."""
    try:
        if _is_url(directory):
            filesystem, base = _filesystem(directory)
            fh = filesystem.open_input_file(f"{base}/{name}")
        else:
            fh = open(Path(directory) / name, "rb")
        with fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > _MAX_HEADER:
                return None
            meta = json.loads(fh.read(size)).get("__metadata__")
    except Exception:  # any file that does not read (deep JSON's RecursionError included) has no owner
        return None
    return meta if isinstance(meta, dict) else None


def job_of(directory: str | os.PathLike[str], name: str) -> str | None:
    """The job identity a checkpoint file carries: None when it has none or does not read."""
    meta = _header_metadata(os.fspath(directory), name)
    job = meta.get("job_id") if meta else None
    return job if isinstance(job, str) and job else None


def save_checkpoint(policy: CheckpointPolicy, *, epoch: int, step: int, model: dict[str, torch.Tensor],
                    optimizer: bytes, strategy_state: dict[str, Any], rng: list[torch.Tensor],
                    history: list[dict[str, float]], workers: int,
                    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """Write one checkpoint atomically, then delete this job's older ones beyond ``policy.keep``."""
    payload = {"format": FORMAT, "job_id": policy.job_id, "epoch": epoch, "step": step, "model": dict(model),
               "optimizer": torch.frombuffer(bytearray(optimizer), dtype=torch.uint8) if optimizer
               else torch.zeros(0, dtype=torch.uint8),
               "strategy_state": strategy_state, "rng": list(rng), "history": history,
               "workers": workers, "epoch_stats": list(epoch_stats)}
    skeleton, tensors = state_io.flatten(payload)
    data = st_save(tensors, metadata={state_io.META_KEY: skeleton, "sha256": _digest(tensors, skeleton),
                                      "digest": _DIGEST_V2, "job_id": policy.job_id})
    name = f"ckpt-e{epoch:05d}-s{step:08d}.safetensors"
    directory = policy.directory
    path = _join(directory, name)
    if _is_url(directory):
        filesystem, base = _filesystem(directory)
        tmp = f"{base}/.{name}.tmp"
        with filesystem.open_output_stream(tmp) as out:
            out.write(data)
        filesystem.move(tmp, f"{base}/{name}")
    else:
        atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    _rotate(policy, name)
    return path


def _rotate(policy: CheckpointPolicy, written: str) -> None:
    """Keep the newest ``policy.keep`` of this job's checkpoints up to the one just ``written``.

    Only files that carry this job's identity and sort before ``written`` are candidates: the
    file just written is never deleted, nor a newer-named file (another job's, or a damaged
    one), nor anything whose header does not read."""
    older = [n for n in checkpoint_names(policy.directory)
             if n < written and job_of(policy.directory, n) == policy.job_id]
    surplus = len(older) - (policy.keep - 1)
    for old in older[:max(surplus, 0)]:
        _delete(policy.directory, old)


def _delete(directory: str, name: str) -> None:
    try:
        if _is_url(directory):
            filesystem, base = _filesystem(directory)
            filesystem.delete_file(f"{base}/{name}")
        else:
            (Path(directory) / name).unlink(missing_ok=True)
    except OSError as exc:  # an old checkpoint left behind is not worth failing the job for
        log.warning("could not delete the old checkpoint %s: %s", name, exc)


def _read(directory: str, name: str) -> bytes:
    if _is_url(directory):
        filesystem, base = _filesystem(directory)
        with filesystem.open_input_stream(f"{base}/{name}") as fh:
            return fh.read()
    return (Path(directory) / name).read_bytes()


def load_checkpoint(directory: str, name: str) -> Checkpoint:
    """Read and verify one checkpoint; ``ValueError`` if it is truncated, altered or not one."""
    return parse_checkpoint(_read(directory, name), _join(directory, name))


def parse_checkpoint(data: bytes, path: str) -> Checkpoint:
    """Verify and decode a checkpoint file's bytes (``path``: where they came from, for messages);
    ``ValueError`` for anything that is not an intact checkpoint."""
    try:
        (size,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8:8 + size]).get("__metadata__") or {}
        tensors = st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"not a readable safetensors file ({exc})") from exc
    skeleton = meta.get(state_io.META_KEY) if isinstance(meta, dict) else None
    version = meta.get("digest") if isinstance(meta, dict) else None
    if not isinstance(skeleton, str) or meta.get("sha256") != _digest(tensors, skeleton, version):
        raise ValueError("its SHA-256 does not match its contents (damaged or altered)")
    try:
        return _checkpoint_from(path, state_io.unflatten(skeleton, tensors))
    except ValueError:
        raise
    except Exception as exc:  # a skeleton that is JSON but not a checkpoint's: damaged, like a bad digest
        raise ValueError(f"its contents are not a checkpoint's ({type(exc).__name__}: {exc})") from exc


def _checkpoint_from(path: str, obj: Any) -> Checkpoint:
    """The verified file's contents as a Checkpoint, checking every field's type on the way."""
    if not isinstance(obj, dict):
        raise ValueError("its contents are not a checkpoint's (not a mapping)")
    if obj.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {obj.get('format')!r}; this sparkdp reads format {FORMAT}")
    ints: dict[str, Any] = {k: obj.get(k) for k in ("epoch", "step", "workers")}  # checked on the next line
    bad = [k for k, v in ints.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
    model, optimizer, stats = obj.get("model"), obj.get("optimizer"), obj.get("epoch_stats")
    if bad or not (isinstance(model, dict) and all(isinstance(v, torch.Tensor) for v in model.values())) \
            or not isinstance(optimizer, torch.Tensor) or not isinstance(obj.get("strategy_state"), dict) \
            or not isinstance(obj.get("rng"), list) or not all(isinstance(r, torch.Tensor) for r in obj["rng"]) \
            or not isinstance(obj.get("history"), list) or not isinstance(stats, list) or len(stats) != 3 \
            or not all(isinstance(x, (int, float)) for x in stats):
        raise ValueError("its contents are not a checkpoint's (a field is missing or of the wrong type"
                         f"{': ' + ', '.join(bad) if bad else ''})")
    job = obj.get("job_id", "")
    return Checkpoint(path=path, epoch=ints["epoch"], step=ints["step"], model=model,
                      optimizer=optimizer.numpy().tobytes(), strategy_state=obj["strategy_state"],
                      rng=list(obj["rng"]), history=list(obj["history"]), workers=ints["workers"],
                      epoch_stats=(float(stats[0]), float(stats[1]), float(stats[2])),
                      job_id=job if isinstance(job, str) else "")


def latest_checkpoint(directory: str | os.PathLike[str], job_id: str | None = None) -> Checkpoint | None:
    """The newest checkpoint that reads and verifies (of job ``job_id`` only, when given); damaged
    newer ones are skipped with a warning."""
    directory = os.fspath(directory)
    for name in reversed(checkpoint_names(directory)):
        if job_id is not None and job_of(directory, name) not in (job_id, None):
            continue  # another job's: never resume from it (a restart would train that job's weights)
        try:
            found = load_checkpoint(directory, name)
        except (OSError, ValueError) as exc:
            log.warning("skipping the checkpoint %s: %s; trying the one before it", _join(directory, name), exc)
            continue
        if job_id is None or found.job_id == job_id:
            return found
    return None


def check_compatible(model: torch.nn.Module, checkpoint: Checkpoint) -> None:
    """The checkpoint's weights fit ``model``: same names, same shapes (else say which differ)."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in checkpoint.model.items()}
    if want == have:
        return
    problems = [f"missing in the checkpoint: {', '.join(sorted(want.keys() - have.keys())[:5])}"] \
        if want.keys() - have.keys() else []
    if have.keys() - want.keys():
        problems.append(f"not in the model: {', '.join(sorted(have.keys() - want.keys())[:5])}")
    shapes = [f"{k} {have[k]} vs the model's {want[k]}" for k in sorted(want.keys() & have.keys()) if want[k] != have[k]]
    if shapes:
        problems.append(f"different shapes: {'; '.join(shapes[:5])}")
    raise ConfigError(f"the checkpoint {checkpoint.path} was written for another model ({'; '.join(problems)}). "
                      "Resume with the model it was saved from, or point resume at another directory.")


__all__ = ["Checkpoint", "CheckpointPolicy", "check_compatible", "check_writable", "checkpoint_names", "job_of",
           "latest_checkpoint", "lineage_of", "load_checkpoint", "new_job_id", "parse_checkpoint",
           "save_checkpoint"]
