"""Hostile sharded-checkpoint manifests: a committed manifest given extra parts whose names
reach outside the reader's temporary directory, each with its bytes planted where the store
reads that name and a matching SHA-256 (what anyone who can write the checkpoint directory can do:
the manifest's digests are no signature)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

PAYLOAD = b"import os  # a .pth line: run at every interpreter start\n"


def plant_hostile_parts(manifest: Path, outside: Path, tempdir: Path | None = None) -> list[Path]:
    """Add an absolute part name (``outside/planted.pth``) and a ``../`` one to ``manifest``;
    plant their bytes where the store would read them. Returns the paths a reader that joined
    part names to its temporary directory would write: ``outside/planted.pth`` and
    ``planted-up.pth`` in ``tempdir``, where the reader's temporary directories are made (by
    default ``tempfile.gettempdir()``)."""
    directory = manifest.parent / manifest.name.removesuffix(".manifest.json")
    outside.mkdir(parents=True, exist_ok=True)  # a directory that exists, as site-packages does
    absolute, upward = str(outside / "planted.pth"), "../planted-up.pth"
    # the store reads f"{directory}/{part}": under the directory for the absolute name, beside it for ../
    for source in (directory / absolute.lstrip("/"), directory.parent / "planted-up.pth"):
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(PAYLOAD)
    record = json.loads(manifest.read_text())
    sha = hashlib.sha256(PAYLOAD).hexdigest()
    record["parts"] = {**record["parts"], absolute: sha, upward: sha}
    manifest.write_text(json.dumps(record))
    return [outside / "planted.pth", Path(tempdir or tempfile.gettempdir()) / "planted-up.pth"]
