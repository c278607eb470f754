"""The one atomic file write every saver uses (models, checkpoints, Caffe weights, summaries)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object], *, make_dirs: bool = True) -> Path:
    """Call ``write(tmp_path)``, flush it to disk, then rename it over ``path``.

    The temporary file sits in the destination's directory, so the rename is atomic: a
    crash or an exception leaves either the old file or the new one, never a half-written
    one, and the temporary file is removed on failure. The new file keeps the mode of the
    file it replaces (else 0644; ``mkstemp`` alone would make it 0600).
    """
    path = Path(path)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:  # the data is on disk before the rename makes it visible
            os.fsync(fh.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
