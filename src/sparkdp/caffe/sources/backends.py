"""Where a Caffe data layer's records live: LMDB, LevelDB and HDF5 access for ``caffe/sources``.

The database packages are optional (``pip install 'sparkdp[caffe-data]'`` for ``lmdb`` and
``h5py``, ``'sparkdp[caffe-leveldb]'`` for ``plyvel``), so they are imported only when a
source of that kind is opened, and a missing one is a :class:`~sparkdp.errors.ConfigError`
naming the extra.  The readers open a database read-only inside one rank and read one
block of consecutive records per call (a cursor scan from the block's first key); see
``caffe/sources/__init__.py`` for why blocks.  LevelDB admits one process per database, so
its reader opens and closes it around every block read, retrying while another rank holds
the lock: a rank never holds the lock while it waits for the others in a collective.
LevelDB also writes a new log file when opened, so its directory must be writable.  plyvel
is a separate extra because it has wheels only for Linux up to Python 3.12 and otherwise
needs the LevelDB library to build.  LMDB is opened read-only without its lock file
(``lock=False``): no process may write to it during training.
Relative paths are looked up as Caffe does (the working directory), then from the
prototxt's (or list's) directory.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, DataError
from ..datum import encode_datum

EXTRA = "pip install 'sparkdp[caffe-data]'"


_SOURCES = {"lmdb": "LMDB sources", "plyvel": "LevelDB sources", "h5py": "HDF5 sources"}


def optional_module(name: str) -> Any:
    """Import an optional package (lmdb, plyvel, h5py), or say which extra provides it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        hint = (
            "pip install 'sparkdp[caffe-leveldb]' (plyvel has wheels for Linux up to Python 3.12; elsewhere it "
            "builds against the LevelDB library, e.g. after apt-get install libleveldb-dev)"
            if name == "plyvel"
            else EXTRA
        )
        raise ConfigError(
            f"{_SOURCES[name]} need the {name} package: {hint} ({name} is not installed here). Or train from other "
            "data (--dataset / --data PATH.parquet)."
        ) from exc


# ------------------------------------------------------------------------- paths


def path_candidates(path: str, base_dirs: Sequence[Path]) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_absolute():
        return [p]
    return [Path.cwd() / p] + [Path(d) / p for d in base_dirs if Path(d).resolve() != Path.cwd().resolve()]


def resolve_path(path: str, base_dirs: Sequence[Path], what: str, where: str, hint: str) -> Path:
    """``path`` from the working directory, then from ``base_dirs``; absolute. DataError if absent."""
    tried = path_candidates(path, base_dirs)
    for candidate in tried:
        if candidate.exists():
            return candidate.resolve()
    raise DataError(
        f"{where}: {what} {path!r} does not exist (looked for {', '.join(repr(str(c)) for c in tried)}). "
        f"{hint}"
    )


# ----------------------------------------------------------------------- readers


# LMDB's meta pages (pages 0 and 1; lmdb.h's MDB_meta after a 16-byte page header, 64-bit
# little-endian builds): magic, version, then the main tree's root and the last page in use.
_LMDB_MAGIC, _LMDB_VERSION = 0xBEEFC0DE, 1
_META = struct.Struct("<II")  # at 16: mm_magic, mm_version
_PAGE_SIZE_AT, _LAST_PAGE_AT, _TXN_AT = 40, 136, 144  # mm_dbs[FREE_DBI].md_pad holds the page size


def check_lmdb_file(path: str) -> None:
    """Refuse an LMDB whose meta pages claim pages beyond the end of its file.

    LMDB maps ``data.mdb`` and follows its page numbers without reading them through the file
    system: a page past the file's end is a SIGBUS that kills the whole worker process (no
    Python exception), which a truncated copy or an edited meta page would cause. LMDB itself
    refuses page numbers above the meta page's last page, so a file that holds every page up
    to it cannot make LMDB read past its end through the tree.
    """
    data_file = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    try:
        with open(data_file, "rb") as handle:
            head = handle.read(16 + _TXN_AT)
            size = os.fstat(handle.fileno()).st_size
            magic, version = _META.unpack_from(head, 16) if len(head) >= 24 else (0, 0)
            page = struct.unpack_from("<I", head, _PAGE_SIZE_AT)[0] if len(head) > _PAGE_SIZE_AT + 4 else 0
            if (
                magic != _LMDB_MAGIC
                or version != _LMDB_VERSION
                or not 512 <= page <= 65536
                or page & (page - 1)
            ):
                raise DataError(
                    f"{data_file!r} is not an LMDB data file this reader knows (magic {magic:#x}, version "
                    f"{version}, page size {page}; expected {_LMDB_MAGIC:#x}, {_LMDB_VERSION}, a power of 2): "
                    "is it damaged, or written on a 32-bit or big-endian machine?"
                )
            handle.seek(page)
            second = handle.read(16 + _TXN_AT)
    except OSError as exc:
        raise DataError(f"cannot read LMDB {data_file!r}: {exc.strerror or exc}") from exc
    for at, meta in ((0, head), (page, second)):
        if len(meta) < _TXN_AT + 8:
            raise DataError(
                f"LMDB {data_file!r} is {size:,} bytes, too short for its two meta pages: "
                "a truncated copy? Copy the database again."
            )
        last = struct.unpack_from("<Q", meta, _LAST_PAGE_AT)[0]
        if (last + 1) * page > size:
            raise DataError(
                f"LMDB {data_file!r} is {size:,} bytes but its meta page at byte {at} uses pages up to "
                f"{last:,} of {page} bytes ({(last + 1) * page:,} bytes): a truncated copy or a damaged file, "
                "which LMDB would read past its end and crash the worker. Copy the database again."
            )


class LMDBReader:
    """Read-only LMDB access for one rank: block scans from a first key."""

    def __init__(self, path: str) -> None:
        lmdb = optional_module("lmdb")
        self.path = path
        check_lmdb_file(path)
        try:
            self.env = lmdb.open(path, readonly=True, lock=False, subdir=os.path.isdir(path))
        except lmdb.Error as exc:
            raise DataError(
                f"cannot open LMDB {path!r}: {exc}. An LMDB source is a directory holding data.mdb (as "
                "Caffe's convert_imageset --backend lmdb writes it)."
            ) from exc

    def keys(self, limit: int | None) -> Iterator[bytes]:
        with self.env.begin() as txn:
            keys = txn.cursor().iternext(keys=True, values=False)
            yield from itertools.islice(keys, limit)

    def read(self, first_key: bytes, start: int, stop: int) -> list[tuple[bytes, bytes]]:
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.set_key(first_key):
                raise changed_error(self.path, first_key)
            return list(itertools.islice(cursor.iternext(keys=True, values=True), start, stop))

    def close(self) -> None:
        self.env.close()


class LevelDBReader:
    """LevelDB access for one rank: opened per block read (one process at a time may hold it)."""

    LOCK_WAIT_S = 600.0

    def __init__(self, path: str) -> None:
        self.plyvel = optional_module("plyvel")
        self.path = path

    def _open(self) -> Any:
        delay, deadline = 0.005, time.monotonic() + self.LOCK_WAIT_S
        while True:
            try:
                return self.plyvel.DB(self.path, create_if_missing=False)
            except self.plyvel.Error as exc:
                text = str(exc)
                if "lock" in text.lower() and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.2)
                    continue
                raise DataError(
                    f"cannot open LevelDB {self.path!r}: {text}. A LevelDB source is a writable directory "
                    "holding CURRENT, MANIFEST-* and *.ldb files (as convert_imageset --backend leveldb writes it)."
                ) from exc

    def keys(self, limit: int | None) -> Iterator[bytes]:
        db = self._open()
        try:
            yield from itertools.islice(db.iterator(include_value=False), limit)
        finally:
            db.close()

    def read(self, first_key: bytes, start: int, stop: int) -> list[tuple[bytes, bytes]]:
        db = self._open()
        try:
            it = db.iterator(start=first_key)
            records = list(itertools.islice(it, start, stop))
        finally:
            db.close()
        if not records or (start == 0 and records[0][0] != first_key):
            raise changed_error(self.path, first_key)
        return records

    def close(self) -> None:
        pass


def changed_error(path: str, key: bytes) -> DataError:
    return DataError(
        f"record {key!r} of {path!r} is gone: the database changed after the job started (sparkdp indexed "
        "its keys on the driver). Do not write to a database while training from it."
    )


def detect_backend(path: Path) -> str | None:
    if path.is_dir():
        if (path / "data.mdb").is_file():
            return "lmdb"
        if (path / "CURRENT").is_file():
            return "leveldb"
    elif path.is_file():
        with open(path, "rb") as handle:
            head = handle.read(32)
        if len(head) >= 20 and int.from_bytes(head[16:20], "little") == 0xBEEFC0DE:  # MDB_MAGIC
            return "lmdb"
    return None


# ----------------------------------------------------------------------- writing


def write_datum_db(
    path: str | os.PathLike[str],
    images: Any,
    labels: Any,
    *,
    backend: str = "lmdb",
    encoding: str | None = None,
    key_format: str = "{:08d}",
) -> int:
    """Write images (N×C×H×W, uint8 or float) and labels as a new Datum database; returns the count.

    Keys are ``key_format.format(index)`` (``convert_mnist_data``'s ``%08d`` by default), so
    key order is row order.  ``encoding="png"``/``"jpg"`` stores encoded images.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if len(images) != len(labels):
        raise DataError(f"{len(images)} images but {len(labels)} labels; give one label per image.")
    target = Path(os.fspath(path))
    if target.exists():
        raise DataError(f"{str(target)!r} already exists; write a new database to a new path.")
    records = [
        (key_format.format(i).encode(), encode_datum(images[i], int(labels[i]), encoding=encoding))
        for i in range(len(images))
    ]
    if backend.lower() == "lmdb":
        lmdb = optional_module("lmdb")
        size = sum(len(k) + len(v) for k, v in records)
        env = lmdb.open(str(target), map_size=max(2 * size + (4 << 20) + 64 * len(records), 1 << 20))
        try:
            with env.begin(write=True) as txn:
                for key, value in records:
                    txn.put(key, value)
        finally:
            env.close()
    elif backend.lower() == "leveldb":
        plyvel = optional_module("plyvel")
        db = plyvel.DB(str(target), create_if_missing=True, error_if_exists=True)
        try:
            with db.write_batch() as batch:
                for key, value in records:
                    batch.put(key, value)
        finally:
            db.close()
    else:
        raise ConfigError(f"backend {backend!r} is not one of lmdb, leveldb.")
    return len(records)


def write_hdf5_source(list_path: str | os.PathLike[str], parts: Sequence[dict[str, Any]]) -> list[Path]:
    """Write one ``.h5`` file per dict of datasets (``{"data": ..., "label": ...}``) next to
    ``list_path`` and the list naming them (relative names, one per line); returns the files."""
    h5py = optional_module("h5py")
    listing = Path(os.fspath(list_path))
    files = []
    for i, datasets in enumerate(parts):
        file = listing.with_name(f"{listing.stem}_{i}.h5")
        with h5py.File(file, "w") as handle:
            for name, values in datasets.items():
                handle.create_dataset(name, data=np.asarray(values))
        files.append(file)
    listing.write_text("".join(f"{f.name}\n" for f in files))
    return files
