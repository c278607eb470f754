"""In-memory training data shared with same-machine workers through memory-mapped files.

A dataset held in the driver's memory normally travels inside every task's closure:
pickled, copied by Spark into a broadcast, and unpickled into one private copy per
worker. For Fashion-MNIST as float32 (188 MB) that cost about 6 s before the first
step (measured with per-phase timestamps, 2 workers on ``local[2]``). When the
executors run on the driver's machine (``local[N]``, ``local-cluster``), the driver
instead writes each tensor once to a file — in ``/dev/shm`` when it has room — and
the closure carries only ``(path, dtype, shape)``. Workers map the file copy-on-write,
so all of them read the same pages and nobody copies the data.

The files live in a private (0700) directory that the driver removes when the job
ends; a directory left by a driver that was killed is removed by the next one. Whether its
owner still runs is asked of the directory itself, not of a process id: the owner holds an
``flock`` on a lock file inside it for as long as it lives (the kernel drops it when the
process dies, however it dies). A process id would be wrong across PID namespaces —
containers sharing ``/dev/shm`` and a uid see each other's directories but not each other's
processes — and after the id is reused.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import DataError
from .base import WorkerData

log = logging.getLogger(__name__)

#: Below this many bytes, shipping in the closure costs nothing worth a file.
MIN_SHARED_BYTES = 1 << 20
_SHM = Path("/dev/shm")
_PREFIX = "sparkdp-data-"
#: the file in an owned directory that its owner keeps flock-ed while it lives
LOCK_FILE = ".owner.lock"


@dataclass(frozen=True)
class MappedTensor:
    """A picklable handle to a tensor stored raw in ``path``; :meth:`load` maps it."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    def load(self) -> torch.Tensor:
        dtype = getattr(torch, self.dtype)
        try:
            # shared=False: MAP_PRIVATE, copy-on-write
            flat = torch.from_file(self.path, shared=False, size=math.prod(self.shape), dtype=dtype)
        except RuntimeError as exc:
            raise DataError(
                f"this worker cannot read the training data the driver shared through {self.path!r} ({exc}). "
                "sparkdp shares in-memory data through files only when the Spark master is local[N] or "
                "local-cluster, whose executors run on the driver's machine; check that the file system "
                "holding it is not full or mounted differently for the executors."
            ) from exc
        return flat.view(self.shape)


class OwnedDirectory:
    """A private (0700) directory ``<root>/<prefix><pid>-*`` that this process holds a lock in
    until :meth:`remove`; :func:`remove_orphans` deletes only those whose lock nobody holds."""

    def __init__(self, root: Path, prefix: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
        try:
            self._lock: int | None = os.open(self.path / LOCK_FILE, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)  # after the removal: until then the directory is visibly in use
            self._lock = None


class SharedTensorDir:
    """A private directory of tensor files for one job; :meth:`close` deletes it."""

    def __init__(self, base: str | os.PathLike | None = None, expected_bytes: int = 0) -> None:
        root = Path(base) if base is not None else _default_base(expected_bytes)
        remove_orphans(root)
        self._owned = OwnedDirectory(root, _PREFIX)
        self.path = self._owned.path
        self._count = 0

    def share(self, tensor: torch.Tensor) -> MappedTensor:
        """Write ``tensor`` once and return the handle workers map it from."""
        t = tensor.detach().cpu().contiguous()
        path = self.path / f"t{self._count}.bin"
        self._count += 1
        t.reshape(-1).view(torch.uint8).numpy().tofile(path)
        return MappedTensor(str(path), str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def close(self) -> None:
        self._owned.remove()


def _default_base(expected_bytes: int) -> Path:
    """``/dev/shm`` (memory) when it exists, is writable and has room; else the temp dir."""
    try:
        if (
            _SHM.is_dir()
            and os.access(_SHM, os.W_OK)
            and shutil.disk_usage(_SHM).free > 2 * expected_bytes + (64 << 20)
        ):
            return _SHM
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def remove_orphans(root: Path, prefix: str = _PREFIX) -> None:
    """Delete this user's ``<prefix><pid>-*`` directories whose owner no longer runs: those whose
    lock file (:class:`OwnedDirectory`) this process can lock. One without a lock file is being
    created, or was not made by this code: it is left alone."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    try:
        candidates = list(root.glob(f"{prefix}*"))
    except OSError:
        return
    for entry in candidates:
        if not pattern.match(entry.name) or not entry.is_dir():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            fd = os.open(entry / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its owner runs (in this PID namespace or another)
        else:
            log.info("removing %s, left by a sparkdp process that no longer runs", entry)
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)


@contextmanager
def shared_with_workers(enabled: bool, *datas):
    """Yield ``datas`` with large in-memory ones backed by shared files (when ``enabled``).

    Other data sources (Parquet, DataFrames) and small arrays pass through unchanged.
    The files are deleted when the block exits, however it exits.
    """
    total = sum(d.shareable_bytes() for d in datas if isinstance(d, WorkerData))  # what sharing moves
    if not enabled or total < MIN_SHARED_BYTES:
        yield datas
        return
    store = SharedTensorDir(expected_bytes=total)
    try:
        shared = tuple(d.shared(store) if isinstance(d, WorkerData) else d for d in datas)
        log.info("sharing %.1f MB of in-memory data with the workers through %s", total / 1e6, store.path)
        yield shared
    finally:
        store.close()
