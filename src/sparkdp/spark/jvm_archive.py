"""The JVM's class-data-sharing archive: the classes a Spark session loads, written once per Java
and Spark installation, so that every later session's JVM maps them from one file instead of
reading, verifying and linking each class from its jar.

On this project's 2-core machine that takes the embedded session's start from about 7 s to 4 s and
its first query from 3.4 s to 2.2 s (docs/benchmarks.md, "The time outside training"). The
archive is the JVM's own mechanism (JDK 13+: ``-XX:ArchiveClassesAtExit`` writes it when a JVM
ends, ``-XX:SharedArchiveFile`` maps it); sparkdp only decides when it is safe to use:

- **Built on request** (``sparkdp env --build-jvm-archive``; ``make setup`` runs it;
  :mod:`sparkdp.spark.jvm_archive_build`): a child
  process starts a session that runs what sparkdp's jobs run (a barrier Arrow stage, an Arrow UDF,
  Parquet), ends its JVM and waits for the archive to be written; a second child must then start a
  JVM that maps it with ``-Xshare:on`` (which fails instead of running without it). Only then is
  it renamed into place. A build that fails or is killed leaves no archive.
- **Never stale.** Its name holds a digest of the ``java`` binary, ``libjvm.so``, every jar of the
  Spark installation and the Spark configuration directory, so a change to any of them looks for
  another file; the JVM itself also refuses an archive whose class path differs, and then runs
  without it.
- **Never half-written.** Its name also holds its size: a JVM mapping a truncated archive dies of
  SIGBUS, so a file whose size is not the one in its name is never passed to a JVM.
- **Written by this user only.** The JVM runs what the archive holds, so the archive and its
  directory must belong to the user starting the session and be writable by nobody else
  (:func:`usable_archive`).
- **Not a requirement.** With no usable archive a session starts as before; one whose JVM does
  not come up with the archive is started again without it, and the archive is removed
  (:mod:`sparkdp.spark.session`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from ..files import cache_dir
from .environment import java_executable

log = logging.getLogger(__name__)

#: the JVM options that keep an archive's messages off the console: a refused archive (another
#: class path) is not an error, and a build warns about every class it cannot archive
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: options that show the caller manages class data sharing itself: sparkdp then adds none
_OWN_SHARING_OPTIONS = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")


def archive_dir() -> Path:
    return cache_dir() / "jvm"


def spark_home() -> Path:
    """The Spark installation whose jars the driver's JVM loads: ``SPARK_HOME``, else PySpark's own."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).parent


def archive_key() -> str | None:
    """A digest of what the archive's classes come from, or None when there is no ``java``."""
    java = java_executable()
    if java is None:
        return None
    java_path = Path(java).resolve()
    digest = hashlib.sha256()
    # bin/java's home: lib/server/libjvm.so is the JVM proper (an update replaces it, not bin/java)
    for path in (java_path, java_path.parent.parent / "lib" / "server" / "libjvm.so"):
        _add_file(digest, path)
    jars = spark_home() / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        _add_file(digest, jar)
    digest.update(f"conf={os.environ.get('SPARK_CONF_DIR', '')}\n".encode())
    return digest.hexdigest()[:24]


def _add_file(digest: hashlib._Hash, path: Path) -> None:
    try:
        st = path.stat()
    except OSError:
        digest.update(f"{path}:missing\n".encode())
        return
    digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())


def archive_name(key: str, size: int) -> str:
    return f"{key}-{size}.jsa"


def _size_in_name(path: Path, key: str) -> int | None:
    middle = path.name[len(key) + 1 : -len(".jsa")]
    return int(middle) if middle.isdigit() else None


def private_to_user(st: os.stat_result) -> bool:
    """Owned by this user and writable by no one else (the JVM runs what the archive holds)."""
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def usable_archive() -> Path | None:
    """This installation's archive, when one is built, complete and private to this user; else None."""
    key = archive_key()
    directory = archive_dir()
    if key is None:
        return None
    try:
        if not private_to_user(os.stat(directory)):
            log.warning(
                "not using the JVM class archives in %s: the directory is not private to this user", directory
            )
            return None
    except OSError:
        return None
    for path in sorted(directory.glob(f"{key}-*.jsa")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or not private_to_user(st):
            log.warning("not using the JVM class archive %s: it is not a file private to this user", path)
            continue
        if _size_in_name(path, key) != st.st_size:
            continue  # truncated or replaced: a JVM mapping it would crash
        if any(ch.isspace() for ch in str(path)):
            return None  # Spark splits extraJavaOptions at white space
        return path
    return None


def java_options(path: Path) -> str:
    """The driver JVM's options that map ``path``, or run without it when the JVM refuses it. A JVM
    that dies of a damaged archive leaves its crash report in the temporary directory, not in the
    user's working directory."""
    crash_report = Path(tempfile.gettempdir()) / "sparkdp-jvm-crash-%p.log"
    return f"-XX:SharedArchiveFile={path} -Xshare:auto {QUIET} -XX:ErrorFile={crash_report}"


def manages_sharing(java_opts: str) -> bool:
    """Whether JVM options already choose class data sharing (sparkdp then leaves it alone)."""
    return any(option in java_opts for option in _OWN_SHARING_OPTIONS)


def remove(path: Path) -> None:
    """Remove an archive a JVM could not start with, so the next session does not try it again."""
    path.unlink(missing_ok=True)
