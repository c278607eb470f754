"""Shipping a launched script's directory to executors that do not share the driver's filesystem.

Not everything beside a script belongs on every executor (or a Spark Connect server): hidden
files and directories (``.env``, ``.aws/credentials``, ``.ssh/``, ``.git/``) are never shipped,
nor is a link to a file outside the directory, nor anything a ``.sparkdpignore`` in the
directory names (its syntax: docs/guide/your-script.md, "What launch ships").
"""

from __future__ import annotations

import atexit
import dataclasses
import fnmatch
import hashlib
import os
import shutil
import tempfile
import zipfile

from ..errors import ConfigError

#: Above this, a script's directory is refused rather than copied to every executor.
MAX_SHIPPED_BYTES = 200 * 2**20
#: The file of patterns, in the script's directory, that keeps files from being shipped.
IGNORE_FILE = ".sparkdpignore"


@dataclasses.dataclass(frozen=True)
class Shipment:
    """What :func:`ship_directory` sent: the archive's name, the files in it and those left out
    (paths relative to the directory, ``/``-separated; a directory left out whole ends in ``/``)."""

    name: str
    files: tuple[str, ...]
    skipped: tuple[str, ...]
    size: int


@dataclasses.dataclass(frozen=True)
class _Rule:
    pattern: str
    negated: bool  # ``!pattern``: ship what an earlier rule (or the hidden-file default) left out
    anchored: bool  # the pattern holds a '/': it matches the path from the directory, else any name
    directories_only: bool  # a trailing '/'


def ignore_rules(text: str) -> list[_Rule]:
    """A ``.sparkdpignore``'s rules: one pattern a line, ``#`` comments and blank lines skipped."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        directories_only = line.endswith("/")
        line = line.strip("/") if directories_only else line.lstrip("/")
        anchored = "/" in raw.strip().lstrip("!").rstrip("/")
        if line:
            rules.append(_Rule(line, negated, anchored, directories_only))
    return rules


def _shipped(rel: str, is_dir: bool, rules: list[_Rule]) -> bool:
    """Whether the entry at ``rel`` (relative, ``/``-separated) ships: not hidden, unless the last
    rule that matches it says otherwise (as in ``.gitignore``, the last match wins)."""
    name = rel.rsplit("/", 1)[-1]
    ship = not name.startswith(".")
    for rule in rules:
        if rule.directories_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(rel if rule.anchored else name, rule.pattern):
            ship = rule.negated
    return ship


def shipped_files(directory: str) -> tuple[list[str], list[str]]:
    """The files of ``directory`` that :func:`ship_directory` sends and the entries it leaves out,
    both sorted (relative, ``/``-separated); a directory left out is not descended into."""
    root = os.path.realpath(directory)
    try:
        with open(os.path.join(directory, IGNORE_FILE), encoding="utf-8") as fh:
            rules = ignore_rules(fh.read())
    except FileNotFoundError:
        rules = []
    files: list[str] = []
    skipped: list[str] = []
    for here, dirs, names in os.walk(directory):
        base = os.path.relpath(here, directory).replace(os.sep, "/")
        prefix = "" if base == "." else base + "/"
        # a linked directory is not followed (it may lead anywhere); a left-out one is not read
        kept = [
            d for d in dirs if _shipped(prefix + d, True, rules) and not os.path.islink(os.path.join(here, d))
        ]
        skipped.extend(prefix + d + "/" for d in dirs if d not in kept)
        dirs[:] = sorted(kept)
        for name in sorted(names):
            full = os.path.join(here, name)
            # a link may point anywhere (~/.aws/credentials): only what lies inside the directory ships
            inside = os.path.realpath(full).startswith(root + os.sep)
            if _shipped(prefix + name, False, rules) and inside and os.path.isfile(full):
                files.append(prefix + name)
            else:
                skipped.append(prefix + name)
    return sorted(files), sorted(skipped)


def ship_directory(spark, directory: str) -> Shipment:
    """Send ``directory``'s :func:`shipped_files` to every executor as a zip that Spark unpacks
    there (``SparkSession.addArtifacts(archive=True)``); its ``name`` is what :func:`shipped_path`
    finds it under in a task.

    Raises:
        ConfigError: the files to ship hold more than :data:`MAX_SHIPPED_BYTES` (they would be
            copied to every executor: keep the script in a directory of its own, data on shared storage).
    """
    files, skipped = shipped_files(directory)
    size = sum(os.path.getsize(os.path.join(directory, rel)) for rel in files)
    if size > MAX_SHIPPED_BYTES:
        raise ConfigError(
            f"the script's directory {directory!r} holds {size / 2**20:.0f} MB to ship, and sparkdp launch "
            f"copies it to every executor (at most {MAX_SHIPPED_BYTES // 2**20} MB). Put the script "
            "and the modules it imports in a directory of their own, and the data on storage every "
            f"executor reads (HDFS, S3, NFS), or name what stays behind in {IGNORE_FILE}."
        )
    # addFile takes local directories only in local mode: ship a zip that Spark unpacks on every node;
    # its name carries a hash of the contents, so a changed script is a new archive, not a clash
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(directory, rel), "rb") as fh:
            digest.update(hashlib.sha256(fh.read()).digest())
    holder = tempfile.mkdtemp(prefix="sparkdp-launch-")
    atexit.register(shutil.rmtree, holder, True)  # the driver serves it to executors while the job runs
    base = f"{os.path.basename(os.path.normpath(directory))}-{digest.hexdigest()[:12]}"
    archive = os.path.join(holder, base + ".zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in files:
            zf.write(os.path.join(directory, rel), rel)
    # classic and Connect alike (Connect streams it in chunks; no size limit of a gRPC message)
    spark.addArtifacts(archive, archive=True)
    return Shipment(os.path.basename(archive), tuple(files), tuple(skipped), size)


def shipped_path(name: str) -> str:
    """Where a directory :func:`ship_directory` sent lies, unpacked, on this executor."""
    from pyspark import SparkFiles

    return SparkFiles.get(name)
