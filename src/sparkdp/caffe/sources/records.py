"""The :class:`~sparkdp.data.base.WorkerData` of a Caffe data layer's source, sharded by blocks.

See ``caffe/sources/__init__.py`` for the assignment of records to ranks (blocks of
consecutive records in a per-epoch seeded order, contiguous per-rank ranges with
``data/parquet.py``'s wrap-around, a seeded shuffle buffer) and why.  These objects are
pickled into every Spark task, so they hold paths and small indexes (a block's first key,
the HDF5 files' row counts), never an open database or file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from ...data.shuffle import UnitData
from ...errors import ConfigError, DataError
from ..caffemodel import MAX_BLOB_AXES, MAX_BLOB_VALUES
from ..datum import datum_array, encoded_size, parse_datum
from .backends import (
    LevelDBReader,
    LMDBReader,
    changed_error,
    detect_backend,
    optional_module,
    path_candidates,
)
from .transform import DatumTransform

SHUFFLE_BUFFER_BYTES = 64 << 20
DEFAULT_BLOCK_ROWS = 256


class CaffeDataSource(UnitData):
    """The records of a Caffe data layer's source, sharded by blocks (see the module docstring).

    Subclasses set ``blocks`` (rows per block, in storage order) and implement ``_chunks``.
    Batches are ``(features float32 N×sample_shape, labels)``; labels are int64 class
    indices when the net's loss reads class labels, else float32.
    """

    equal_batches = True

    def __init__(
        self, *, layer: str, phase: str, shuffle: bool, shuffle_buffer: int | None, block_rows: int
    ) -> None:
        if block_rows < 1:
            raise ConfigError(f"block_rows must be >= 1; got {block_rows}.")
        self.layer, self.phase = layer, phase
        self.can_shuffle = shuffle  # the layer's own shuffle setting
        self.block_rows = int(block_rows)
        self.blocks: list[int] = []
        self.sample_shape: tuple[int, ...] = ()
        self._shuffle_buffer = shuffle_buffer

    @property
    def rows(self) -> int:
        return sum(self.blocks)

    def num_samples(self) -> int:
        return self.rows

    @property
    def shuffle_buffer(self) -> int:  # type: ignore[override]  # UnitData's attribute, computed here
        if self._shuffle_buffer is not None:
            return int(self._shuffle_buffer)
        row_bytes = 4 * max(1, math.prod(self.sample_shape))  # exact: an int64 product can wrap to 0
        return max(1, min(10_000, SHUFFLE_BUFFER_BYTES // row_bytes))

    def unit_rows(self) -> list[int]:
        return self.blocks

    # ---------------------------------------------------------------- reading
    def _chunks(
        self, segments: list[tuple[int, int, int]], rng: np.random.Generator
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def read(
        self, segments: list[tuple[int, int, int]], *, seed: int, epoch: int, rank: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # the transform's random crops and mirrors: seeded by (seed, epoch, rank) like the shuffle
        return self._chunks(
            segments, np.random.default_rng([int(seed) % 2**32, int(epoch), int(rank), 0xCAFFE])
        )


class DatumDBSource(CaffeDataSource):
    """A ``Data`` layer's LMDB or LevelDB of serialized Datum records.

    Args:
        path: the database (absolute, or relative to the working directory).
        backend: ``"lmdb"``, ``"leveldb"``, or None to tell by the directory's files.
        transform: the layer's ``transform_param`` (default: none).
        class_labels: labels as int64 class indices (else float32).
        limit: read only the first ``limit`` records (in key order).
        shuffle: whether training may shuffle (the loop's ``shuffle`` must also be on).
        shuffle_buffer: rows of each rank's shuffle buffer (default: about 64 MiB of rows).
        block_rows: consecutive records per block (the unit of sharding and shuffling).
        layer, phase: for messages (``phase`` also sets the default TRAIN/TEST crops).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        backend: str | None = None,
        transform: DatumTransform | None = None,
        class_labels: bool = True,
        limit: int | None = None,
        shuffle: bool = True,
        shuffle_buffer: int | None = None,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        layer: str = "",
        phase: str = "TRAIN",
    ) -> None:
        super().__init__(
            layer=layer, phase=phase, shuffle=shuffle, shuffle_buffer=shuffle_buffer, block_rows=block_rows
        )
        where = layer or "Caffe data source"
        p = Path(os.fspath(path)).expanduser().absolute()
        stated = backend.lower() if backend else None
        if stated not in (None, "lmdb", "leveldb"):
            raise ConfigError(f"{where}: backend {backend!r} is not one of LMDB, LEVELDB.")
        if not p.exists():
            raise DataError(
                f"{where}: the {(stated or 'LMDB/LevelDB').upper()} source {str(p)!r} does not exist. Create it "
                "(Caffe's convert_imageset / convert_mnist_data, or sparkdp.caffe.sources.write_datum_db), "
                "fix data_param source, or train from other data (--dataset / --data)."
            )
        found = detect_backend(p)
        if stated and found and found != stated:
            raise DataError(
                f"{where}: {str(p)!r} is a{'n LMDB' if found == 'lmdb' else ' LevelDB'} database but the layer "
                f"says backend: {stated.upper()}; set data_param {{ backend: {found.upper()} }}."
            )
        if found is None:
            want = stated or "lmdb"
            raise DataError(
                f"{where}: {str(p)!r} is not a{'n LMDB' if want == 'lmdb' else ' LevelDB'} database ("
                + ("no data.mdb inside" if want == "lmdb" else "no CURRENT file inside")
                + "). Caffe's Data layer reads a directory written by convert_imageset / convert_mnist_data: "
                "LMDB holds data.mdb, LevelDB holds CURRENT and *.ldb files."
            )
        self.backend, self.path = found, str(p)
        self.transform = transform or DatumTransform(train=str(phase).upper() == "TRAIN")
        self.class_labels = bool(class_labels)
        self.first_keys: list[bytes] = []
        reader = self._reader()
        try:
            for i, key in enumerate(reader.keys(limit)):
                if i % self.block_rows == 0:
                    self.first_keys.append(bytes(key))
                    self.blocks.append(0)
                self.blocks[-1] += 1
            if not self.blocks:
                raise DataError(
                    f"{where}: the {self.backend.upper()} database {self.path!r} is empty (0 records)."
                )
            key, value = reader.read(self.first_keys[0], 0, 1)[0]
        finally:
            reader.close()
        first = datum_array(
            parse_datum(value, self._name(key)), color=self.transform.color, source=self._name(key)
        )
        # datum_array gives (C, H, W)
        self.record_shape: tuple[int, int, int] = tuple(int(d) for d in first.shape)  # type: ignore[assignment]
        self.record_dtype = str(first.dtype)
        self.transform.check(self.record_shape, f"{where} ({self.path})")
        self.sample_shape = self.transform.output_shape(self.record_shape)

    def _reader(self) -> LMDBReader | LevelDBReader:
        return LMDBReader(self.path) if self.backend == "lmdb" else LevelDBReader(self.path)

    def _name(self, key: bytes) -> str:
        return f"{self.path} record {bytes(key)!r}"

    def _chunks(self, segments, rng):
        reader = self._reader()
        try:
            for block, start, stop in segments:
                records = reader.read(self.first_keys[block], start, stop)
                if len(records) != stop - start:
                    raise changed_error(self.path, self.first_keys[block])
                x, y = self._decode(records)
                yield torch.from_numpy(self.transform(x, rng)), torch.from_numpy(y)
        finally:
            reader.close()

    def _decode(self, records: list[tuple[bytes, bytes]]) -> tuple[np.ndarray, np.ndarray]:
        arrays, labels = [], np.empty(len(records), dtype=np.int64)
        for i, (key, value) in enumerate(records):
            datum = parse_datum(value, self._name(key))
            if datum.encoded:  # the image's size from its header: one of another size is refused undecoded
                height, width = encoded_size(datum, self._name(key))
                if (height, width) != self.record_shape[1:]:
                    self._wrong_size(key, f"{height}×{width} (H×W)")
            arr = datum_array(datum, color=self.transform.color, source=self._name(key))
            if arr.shape != self.record_shape:
                self._wrong_size(key, f"{'×'.join(map(str, arr.shape))} (C×H×W)")
            arrays.append(arr)
            labels[i] = datum.label
        x = np.stack(arrays)
        return x, (labels if self.class_labels else labels.astype(np.float32))

    def _wrong_size(self, key: bytes, found: str) -> NoReturn:
        raise DataError(
            f"{self._name(key)} is {found} but the net's input, built from the first record, is "
            f"{'×'.join(map(str, self.record_shape))} (C×H×W); Caffe's Data layer needs every record the same "
            "size. Rewrite the database with one size (convert_imageset --resize_height/--resize_width)."
        )

    def describe(self) -> str:
        shape = "×".join(map(str, self.record_shape))
        return (
            f"{self.backend.upper()} {self.path!r}: {self.rows} Datum records {shape} {self.record_dtype} in "
            f"{len(self.blocks)} blocks of {self.block_rows}; {self.phase} transform: {self.transform.describe()}"
        )


class HDF5Source(CaffeDataSource):
    """An ``HDF5Data`` layer's files: ``source`` lists ``.h5`` files, one per line.

    Args:
        list_path: the text file listing the HDF5 files (relative ones are looked up from
            the working directory, as Caffe does, then from the list's directory).
        data_top, label_top: the datasets read as features and labels (the layer's tops).
        class_labels: labels as int64 class indices of shape (N,) (else float32 as stored).
        shuffle: ``hdf5_data_param { shuffle }``: shuffle blocks and rows in training.
        limit, shuffle_buffer, block_rows, layer, phase: as for :class:`DatumDBSource`.
    """

    def __init__(
        self,
        list_path: str | os.PathLike[str],
        *,
        data_top: str = "data",
        label_top: str | None = "label",
        class_labels: bool = True,
        shuffle: bool = False,
        limit: int | None = None,
        shuffle_buffer: int | None = None,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        layer: str = "",
        phase: str = "TRAIN",
    ) -> None:
        super().__init__(
            layer=layer, phase=phase, shuffle=shuffle, shuffle_buffer=shuffle_buffer, block_rows=block_rows
        )
        h5py = optional_module("h5py")
        where = layer or "HDF5Data source"
        listing = Path(os.fspath(list_path)).expanduser().absolute()
        if not listing.is_file():
            raise DataError(
                f"{where}: hdf5_data_param source {str(listing)!r} does not exist; it must be a text file "
                "listing the .h5 files, one per line."
            )
        self.list_path, self.data_top, self.label_top = str(listing), data_top, label_top
        self.class_labels = bool(class_labels)
        names: list[tuple[str, str]] = []
        for number, line in enumerate(listing.read_text().splitlines(), start=1):
            if line.strip():
                names.append((line.strip(), f"{listing}:{number}"))
        if not names:
            raise DataError(
                f"{where}: the HDF5 list {str(listing)!r} names no files; list the .h5 files, one per line."
            )
        files, missing = [], []
        for name, at in names:
            tried = path_candidates(name, [listing.parent])
            found = next((c for c in tried if c.is_file()), None)
            if found is None:
                missing.append(f"{at}: {name}")
            else:
                files.append((str(found.resolve()), at))
        if missing:
            raise DataError(
                f"{where}: {len(missing)} file(s) named in {str(listing)!r} do not exist (relative paths are looked "
                "up from the working directory, then from the list's directory): " + "; ".join(missing)
            )
        self.files: list[str] = []  # the files with rows to read
        self.units: list[tuple[int, int]] = []  # (file index, first row) per block
        row_shapes: dict[str, tuple[tuple[int, ...], str]] = {}
        remaining = limit
        tops = [data_top] + ([label_top] if label_top else [])
        for path, at in files:
            try:
                with h5py.File(path, "r") as handle:
                    counts = []
                    for top in tops:
                        if top not in handle:
                            raise DataError(
                                f"{at}: {path!r} has no dataset {top!r} (it has {sorted(handle.keys())}); an HDF5Data "
                                "layer reads one dataset per top, named like the top."
                            )
                        shape = tuple(int(d) for d in handle[top].shape)
                        if not shape:
                            raise DataError(
                                f"{at}: dataset {top!r} of {path!r} is a scalar; it needs rows (N, ...)."
                            )
                        # HDF5 stores unwritten chunks as nothing, so a tiny file can declare rows no
                        # array can hold; Caffe's loader refuses them too (blob axes and count limits)
                        # (the whole dataset too: Caffe's HDF5 layer loads a file into one blob, and a row
                        # count of 2**60 would otherwise become 2**52 read units here)
                        if len(shape) > MAX_BLOB_AXES or math.prod(shape) > MAX_BLOB_VALUES:
                            raise DataError(
                                f"{at}: dataset {top!r} of {path!r} has shape {shape}; Caffe loads it into one blob, "
                                f"which has at most {MAX_BLOB_AXES} axes and {MAX_BLOB_VALUES:,} values. Is the "
                                "file damaged?"
                            )
                        seen = row_shapes.setdefault(top, (shape[1:], at))
                        if seen[0] != shape[1:]:
                            raise DataError(
                                f"{at}: dataset {top!r} of {path!r} has rows of shape {shape[1:]} but {seen[1]} "
                                f"has {seen[0]}; every file must hold the same row shape."
                            )
                        counts.append(shape[0])
            except OSError as exc:
                raise DataError(f"{at}: cannot read HDF5 file {path!r}: {exc}.") from exc
            if len(set(counts)) > 1:
                raise DataError(
                    f"{at}: the datasets {tops} of {path!r} have {counts} rows; Caffe needs the same number of rows "
                    "in every top's dataset."
                )
            rows = counts[0] if remaining is None else min(counts[0], remaining)
            if rows:
                self.files.append(path)
                for first in range(0, rows, self.block_rows):
                    self.units.append((len(self.files) - 1, first))
                    self.blocks.append(min(self.block_rows, rows - first))
            if remaining is not None:
                remaining -= rows
                if remaining <= 0:
                    break
        if not self.blocks:
            raise DataError(f"{where}: the HDF5 files listed in {str(listing)!r} hold no rows.")
        self.sample_shape = row_shapes[data_top][0]
        self.label_shape = row_shapes[label_top][0] if label_top else ()
        if self.class_labels and math.prod(self.label_shape) != 1:
            raise DataError(
                f"{where}: dataset {label_top!r} has rows of shape {self.label_shape}, but the net's loss reads one "
                "class index per row; store labels as (N,) or (N, 1)."
            )

    def label_row_shape(self) -> tuple[int, ...]:
        """One row's label shape as batches carry it: () for class indices."""
        return () if self.class_labels else self.label_shape

    def _chunks(self, segments, rng):
        h5py = optional_module("h5py")
        handles: dict[int, Any] = {}
        try:
            for block, start, stop in segments:
                index, first = self.units[block]
                if index not in handles:
                    handles[index] = h5py.File(self.files[index], "r")
                handle = handles[index]
                a, b = first + start, first + stop
                x = np.asarray(handle[self.data_top][a:b], dtype=np.float32)
                if self.label_top is None:
                    y = np.zeros(b - a, dtype=np.int64)
                elif self.class_labels:
                    y = np.asarray(handle[self.label_top][a:b]).reshape(b - a).astype(np.int64)
                else:
                    y = np.asarray(handle[self.label_top][a:b], dtype=np.float32)
                yield torch.from_numpy(x), torch.from_numpy(y)
        finally:
            for handle in handles.values():
                handle.close()

    def describe(self) -> str:
        return (
            f"HDF5 {self.list_path!r}: {self.rows} rows in {len(self.files)} file(s), {self.data_top!r} "
            f"{self.sample_shape}, {self.label_top!r} {self.label_shape}; shuffle {self.can_shuffle}"
        )
