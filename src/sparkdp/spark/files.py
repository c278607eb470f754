"""Shipping a launched script's directory to executors that do not share the driver's filesystem."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile

from ..errors import ConfigError

#: Above this, a script's directory is refused rather than copied to every executor.
MAX_SHIPPED_BYTES = 200 * 2**20


def ship_directory(spark, directory: str) -> str:
    """Send ``directory`` (recursively) to every executor as a zip that Spark unpacks there
    (``SparkSession.addArtifacts(archive=True)``); returns the name :func:`shipped_path` finds it under in a task.

    Raises:
        ConfigError: the directory holds more than :data:`MAX_SHIPPED_BYTES` (it would be copied
            to every executor: keep the script in a directory of its own, data on shared storage).
    """
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(directory)
        for name in names
        if os.path.isfile(os.path.join(root, name))
    )
    if size > MAX_SHIPPED_BYTES:
        raise ConfigError(
            f"the script's directory {directory!r} holds {size / 2**20:.0f} MB, and sparkdp launch "
            f"copies it to every executor (at most {MAX_SHIPPED_BYTES // 2**20} MB). Put the script "
            "and the modules it imports in a directory of their own, and the data on storage every "
            "executor reads (HDFS, S3, NFS)."
        )
    # addFile takes local directories only in local mode: ship a zip that Spark unpacks on every node;
    # its name carries a hash of the contents, so a changed script is a new archive, not a clash
    digest = hashlib.sha256()
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, directory).encode())
            with open(full, "rb") as fh:
                digest.update(fh.read())
    holder = tempfile.mkdtemp(prefix="sparkdp-launch-")
    atexit.register(shutil.rmtree, holder, True)  # the driver serves it to executors while the job runs
    base = f"{os.path.basename(os.path.normpath(directory))}-{digest.hexdigest()[:12]}"
    archive = shutil.make_archive(os.path.join(holder, base), "zip", directory)
    # classic and Connect alike (Connect streams it in chunks; no size limit of a gRPC message)
    spark.addArtifacts(archive, archive=True)
    return os.path.basename(archive)


def shipped_path(name: str) -> str:
    """Where a directory :func:`ship_directory` sent lies, unpacked, on this executor."""
    from pyspark import SparkFiles

    return SparkFiles.get(name)
