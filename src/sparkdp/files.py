"""The one atomic file write every saver uses (models, checkpoints, Caffe weights, summaries), and
the cache directory."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """Where sparkdp keeps what it builds once per machine (tokenizers, token blocks, the JVM's class
    archive): ``SPARKDP_CACHE``, else ``$XDG_CACHE_HOME/sparkdp``, else ``~/.cache/sparkdp``."""
    if os.environ.get("SPARKDP_CACHE"):
        return Path(os.environ["SPARKDP_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkdp"


def process_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` alone must set it to read it,
    which would race with other threads creating files)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc (not Linux): the classic read-by-setting, restored at once
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable: without this a power loss can forget the new name."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a filesystem that cannot open directories (some FUSE mounts): nothing to sync
        return
    try:
        os.fsync(fd)
    except OSError:  # EINVAL on filesystems without directory fsync; the data itself is synced
        pass
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[str], object], *, make_dirs: bool = True
) -> Path:
    """Call ``write(tmp_path)``, flush it to disk, rename it over ``path``, then sync the directory.

    The temporary file sits in the destination's directory, so the rename is atomic: a
    crash or an exception leaves either the old file or the new one, never a half-written
    one, and the temporary file is removed on failure. The new file keeps the mode of the
    file it replaces; a new file gets what ``open`` would give it, ``0666`` less the umask
    (``mkstemp`` alone would make it 0600), so a umask of 077 keeps checkpoints private.
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
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~process_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path
