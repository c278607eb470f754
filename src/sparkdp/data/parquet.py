"""Parquet files read where they live: each worker streams its own row groups.

The driver only reads the files' footers (row counts per row group) and the
schema, so bad column names or types fail before any Spark job starts. Each
worker then opens the files itself with pyarrow and streams record batches of
its row groups (``ParquetFile.iter_batches``): nothing is collected to the
driver, nothing is copied, and every epoch reads the files again, so
multi-epoch training costs no extra memory.

Assignment of rows to ranks, per epoch: the row groups are put in a seeded
per-epoch order (storage order when ``shuffle=False``), laid end to end, and
rank ``r`` reads the contiguous row range ``[r * k, (r + 1) * k)`` with
``k = ceil(rows / world_size)`` — whole row groups except at most two cut ones
per rank. The last rank wraps around to the first rows (at most
``world_size - 1`` duplicated rows per epoch), exactly like torch's
``DistributedSampler``, so every rank gets the same number of rows and batches
and the synchronous strategies need no per-step "out of data" check. Within a
rank, rows are mixed by a bounded shuffle buffer seeded by (seed, epoch, rank).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import torch

from ..errors import DataError
from .arrow import ArrowConverter
from .row_order import LaneOrder, UnitRows, cache_rows
from .shuffle import Chunk, UnitData, rank_segments

log = logging.getLogger(__name__)

Segment = tuple[int, int, int]  # (unit index, first row, end row) within a row group


class ParquetData(UnitData):
    """Training data in Parquet files (a file, a directory of part files, or a list of files).

    Args:
        path: a path or URI (``file:``, ``hdfs://``, ``s3://`` as pyarrow supports them),
            a directory (Spark's ``part-*.parquet`` output; ``_SUCCESS``/``.crc`` are ignored),
            or a list of files.
        features, label, feature_shape, drop_nulls, num_classes, dict_batches: see
            :class:`~sparkdp.data.arrow.ArrowConverter`.
        shuffle_buffer: rows held by each worker's shuffle buffer (0: no shuffling within a worker).
        read_rows: rows per Arrow record batch read from the files.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str],
        *,
        features: str | Sequence[str],
        label: str | None,
        feature_shape: Sequence[int] | None = None,
        drop_nulls: bool = False,
        num_classes: int | None = None,
        shuffle_buffer: int = 10_000,
        read_rows: int = 8192,
        filesystem: Any = None,
        dict_batches: bool = False,
    ) -> None:
        source = os.fspath(path) if isinstance(path, (str, os.PathLike)) else [os.fspath(p) for p in path]
        try:
            dataset = pds.dataset(source, format="parquet", filesystem=filesystem)
        except (OSError, ValueError, pa.ArrowInvalid) as exc:
            raise DataError(
                f"cannot open Parquet data at {path!r}: {exc}. Pass a Parquet file, a directory of "
                "Parquet files, or a list of files that exist and are readable."
            ) from exc
        self.filesystem = dataset.filesystem
        self.files: list[str] = []
        self.units: list[tuple[int, int, int]] = []  # (file index, row group, rows)
        for fragment in dataset.get_fragments():
            meta = fragment.metadata
            self.files.append(fragment.path)
            for rg in range(meta.num_row_groups):
                rows = meta.row_group(rg).num_rows
                if rows:
                    self.units.append((len(self.files) - 1, rg, rows))
        self.rows = sum(u[2] for u in self.units)
        if not self.files:
            raise DataError(
                f"no Parquet files found at {path!r}; check the path (a directory must contain "
                "*.parquet files not starting with '_' or '.')."
            )
        if self.rows == 0:
            raise DataError(
                f"the Parquet data at {path!r} is empty (0 rows); give at least one row per worker."
            )
        self.converter = ArrowConverter(
            dataset.schema,
            features,
            label,
            feature_shape=feature_shape,
            drop_nulls=drop_nulls,
            num_classes=num_classes,
            dict_batches=dict_batches,
        )
        self.shuffle_buffer = int(shuffle_buffer)
        self.read_rows = int(read_rows)
        # Equal row counts give equal batch counts unless rows can be dropped for nulls.
        self.equal_batches = not drop_nulls
        self.source = str(path)

    def num_samples(self) -> int:
        return self.rows

    def counters(self) -> dict[str, int]:
        """Per-worker counts the training loop sums over ranks and reports."""
        return {"dropped_null_rows": self.converter.dropped}

    def unit_rows(self) -> list[int]:
        return [unit[2] for unit in self.units]

    # ------------------------------------------------------------------ reading
    def record_batches(self, segments: list[Segment]) -> Iterator[pa.RecordBatch]:
        """Stream the record batches of ``segments``, sliced to their row ranges."""
        columns = self.converter.columns
        local = isinstance(self.filesystem, pafs.LocalFileSystem)
        for unit, start, stop in segments:
            file_index, rg, _rows = self.units[unit]
            path = self.files[file_index]
            # Local files are memory-mapped: decoding reads the page cache in place instead of
            # copying each column chunk first. One mapping per row group keeps the mapped
            # pages (which count as resident memory) to one row group's worth.
            source = pa.memory_map(path) if local else self.filesystem.open_input_file(path)
            with source, pq.ParquetFile(source) as reader:
                offset = 0
                # single-threaded decoding: a task owns one core (spark.task.cpus)
                for rb in reader.iter_batches(
                    batch_size=self.read_rows, row_groups=[rg], columns=columns, use_threads=False
                ):
                    a, b = max(start, offset), min(stop, offset + rb.num_rows)
                    if a < b:
                        yield rb if (a, b) == (offset, offset + rb.num_rows) else rb.slice(a - offset, b - a)
                    offset += rb.num_rows
                    if offset >= stop:
                        break

    def read(self, segments: list[Segment], *, seed: int, epoch: int, rank: int) -> Iterator[Chunk]:
        return (self.converter.convert(rb) for rb in self.record_batches(segments))

    def batches(self, **kwargs: Any) -> Iterator[Any]:  # (dict, labels) with dict_batches
        batches = super().batches(**kwargs)
        return map(self.converter.pack, batches) if self.converter.dict_batches else batches

    def eval_batches(self, **kwargs: Any) -> Iterator[Any]:  # as batches
        batches = super().eval_batches(**kwargs)
        return map(self.converter.pack, batches) if self.converter.dict_batches else batches

    # ------------------------------------------------------------------ rows by id (fault_tolerance="step")
    def epoch_order(self, epoch: int, seed: int, shuffle: bool, *, lanes: int, block: int) -> LaneOrder:
        """Epoch ``epoch``'s order of the rows for a job of ``lanes`` worker slots taking ``block``
        rows of each lane a step (``data.row_order``): row groups in a seeded order, rows permuted
        within windows of ``shuffle_buffer`` rows."""
        return LaneOrder(self.unit_rows(), epoch, seed, shuffle, self.shuffle_buffer, lanes, block)

    def rows_at(self, ids: torch.Tensor) -> tuple[Any, Any]:
        """The rows ``ids`` (positions in storage order) as one batch, read by whole row groups
        through a cache of about two shuffle windows (``data.row_order.UnitRows``)."""
        tensors = self.row_reader.take(ids)
        if self.converter.dict_batches:
            return self.converter.pack(tensors)
        return tensors[0], (tensors[1] if len(tensors) > 1 else None)

    @property
    def row_reader(self) -> UnitRows:
        """This copy's reader of rows by id (made at first use; each worker has its own)."""
        reader = self.__dict__.get("_rows")
        if reader is None:
            sizes = self.unit_rows()
            reader = self._rows = UnitRows(sizes, self._read_unit, cache_rows(sizes, self.shuffle_buffer))
        return reader

    def _read_unit(self, unit: int) -> tuple[torch.Tensor, ...]:
        chunks = [self.converter.convert(rb) for rb in self.record_batches([(unit, 0, self.units[unit][2])])]
        return tuple(torch.cat(columns) for columns in zip(*chunks, strict=True))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_rows"}  # a worker reads its own

    def sample(self, rows: int = 2) -> pa.RecordBatch:
        """The first ``rows`` rows (read on the driver, for checks before training)."""
        segments, left = [], min(rows, self.rows)
        for unit, first, end in rank_segments(
            self.unit_rows(), range(len(self.units)), rank=0, world_size=1, pad=False
        ):
            take = min(end - first, left)
            segments.append((unit, first, first + take))
            left -= take
            if not left:
                break
        return next(self.record_batches(segments))

    def describe(self) -> str:
        return (
            f"Parquet {self.source!r}: {self.rows} rows in {len(self.units)} row groups of "
            f"{len(self.files)} file(s); {self.converter.describe()}"
        )
