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
ends; a directory left by a driver that was killed is removed by the next one.
"""

from __future__ import annotations

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


class SharedTensorDir:
    """A private directory of tensor files for one job; :meth:`close` deletes it."""

    def __init__(self, base: str | os.PathLike | None = None, expected_bytes: int = 0) -> None:
        root = Path(base) if base is not None else _default_base(expected_bytes)
        remove_orphans(root)
        self.path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=root))
        self._count = 0

    def share(self, tensor: torch.Tensor) -> MappedTensor:
        """Write ``tensor`` once and return the handle workers map it from."""
        t = tensor.detach().cpu().contiguous()
        path = self.path / f"t{self._count}.bin"
        self._count += 1
        t.reshape(-1).view(torch.uint8).numpy().tofile(path)
        return MappedTensor(str(path), str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _default_base(expected_bytes: int) -> Path:
    """``/dev/shm`` (memory) when it exists, is writable and has room; else the temp dir."""
    try:
        if _SHM.is_dir() and os.access(_SHM, os.W_OK) and shutil.disk_usage(_SHM).free > 2 * expected_bytes + (64 << 20):
            return _SHM
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def remove_orphans(root: Path, prefix: str = _PREFIX) -> None:
    """Delete ``<prefix><pid>-*`` directories a killed process left behind (that pid is gone)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    try:
        candidates = list(root.glob(f"{prefix}*"))
    except OSError:
        return
    for entry in candidates:
        match = pattern.match(entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            log.info("removing %s, left by a sparkdp process that no longer runs", entry)
            shutil.rmtree(entry, ignore_errors=True)
        except (OSError, ValueError):
            continue


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
