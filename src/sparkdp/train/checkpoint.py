"""Training checkpoints: everything a synchronous job needs to continue where it stopped.

One checkpoint is one ``.safetensors`` file (``sparkdp.state``: tensors as safetensors entries,
the nesting around them as JSON metadata; nothing executes code on load) holding the model,
the optimizer and scheduler state, the strategy's state, every rank's RNG state, the position
in the data (epoch, steps done in it) and the history so far, plus a SHA-256 of its tensors.
It is written under a temporary name and renamed (``sparkdp.files.atomic_write``), so a crash
never leaves a half-written file where a good one was; a file whose digest does not match is
skipped on resume with a warning, and the previous one is used.

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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .. import state as state_io
from ..errors import ConfigError
from ..files import atomic_write

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-e(\d{5})-s(\d{8})\.safetensors$")
FORMAT = 1


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often a job saves checkpoints.

    Attributes:
        directory: a local directory or a pyarrow filesystem URL.
        every_steps: also save every this many optimizer steps (``None``: epoch ends only).
        every_seconds: also save when this many seconds passed since the last save.
        keep: how many checkpoints to keep (the newest; older ones are deleted).
    """

    directory: str
    every_steps: int | None = None
    every_seconds: float | None = None
    keep: int = 3

    def __post_init__(self) -> None:
        if self.every_steps is not None and (isinstance(self.every_steps, bool) or not isinstance(self.every_steps, int)
                                             or self.every_steps < 1):
            raise ConfigError(f"checkpoint_every (steps) must be a positive integer or None; got {self.every_steps!r}.")
        if self.every_seconds is not None and not (isinstance(self.every_seconds, (int, float))
                                                   and self.every_seconds > 0):
            raise ConfigError(f"checkpoint_every_s must be a number of seconds > 0 or None; got {self.every_seconds!r}.")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ConfigError(f"keep_checkpoints must be an integer >= 1; got {self.keep!r}.")


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


def _digest(tensors: dict[str, torch.Tensor], skeleton: str) -> str:
    h = hashlib.sha256(skeleton.encode())
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(policy: CheckpointPolicy, *, epoch: int, step: int, model: dict[str, torch.Tensor],
                    optimizer: bytes, strategy_state: dict[str, Any], rng: list[torch.Tensor],
                    history: list[dict[str, float]], workers: int,
                    epoch_stats: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """Write one checkpoint atomically, then delete all but the newest ``policy.keep``."""
    payload = {"format": FORMAT, "epoch": epoch, "step": step, "model": dict(model),
               "optimizer": torch.frombuffer(bytearray(optimizer), dtype=torch.uint8) if optimizer
               else torch.zeros(0, dtype=torch.uint8),
               "strategy_state": strategy_state, "rng": list(rng), "history": history,
               "workers": workers, "epoch_stats": list(epoch_stats)}
    skeleton, tensors = state_io.flatten(payload)
    data = st_save(tensors, metadata={state_io.META_KEY: skeleton, "sha256": _digest(tensors, skeleton)})
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
    for old in checkpoint_names(directory)[:-policy.keep]:
        _delete(directory, old)
    return path


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
    data = _read(directory, name)
    try:
        (size,) = struct.unpack("<Q", data[:8])
        meta = json.loads(data[8:8 + size]).get("__metadata__") or {}
        tensors = st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise ValueError(f"not a readable safetensors file ({exc})") from exc
    skeleton = meta.get(state_io.META_KEY)
    if skeleton is None or meta.get("sha256") != _digest(tensors, skeleton):
        raise ValueError("its SHA-256 does not match its contents (damaged or altered)")
    obj = state_io.unflatten(skeleton, tensors)
    if obj.get("format") != FORMAT:
        raise ValueError(f"checkpoint format {obj.get('format')!r}; this sparkdp reads format {FORMAT}")
    return Checkpoint(path=_join(directory, name), epoch=obj["epoch"], step=obj["step"], model=obj["model"],
                      optimizer=obj["optimizer"].numpy().tobytes(), strategy_state=obj["strategy_state"],
                      rng=list(obj["rng"]), history=list(obj["history"]), workers=obj["workers"],
                      epoch_stats=tuple(obj["epoch_stats"]))


def latest_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint | None:
    """The newest checkpoint that reads and verifies; damaged newer ones are skipped with a warning."""
    directory = os.fspath(directory)
    for name in reversed(checkpoint_names(directory)):
        try:
            return load_checkpoint(directory, name)
        except (OSError, ValueError, KeyError) as exc:
            log.warning("skipping the checkpoint %s: %s; trying the one before it", _join(directory, name), exc)
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


__all__ = ["Checkpoint", "CheckpointPolicy", "check_compatible", "check_writable", "checkpoint_names",
           "latest_checkpoint", "load_checkpoint", "save_checkpoint"]
