"""Spark DataFrames as training data, streamed where they live.

Two routes, chosen per DataFrame:

1. **A plain Parquet scan** (``spark.read.parquet(p)`` with at most a column
   selection): the workers read the files themselves (:class:`ParquetData`), so
   every epoch re-reads the files and nothing passes through Spark's executors.
2. **Anything else** (joins, UDFs, VectorAssembler output, in-memory frames): with
   ``fault_tolerance="step"``, written to Parquet once (:func:`write_parquet`) and read as
   route 1; otherwise one
   barrier stage per epoch over the DataFrame itself with
   ``df.mapInArrow(task, schema, barrier=True)``. Each task streams its
   partition's Arrow record batches through a bounded shuffle buffer into the
   same training loop (:func:`~sparkdp.train.loop.fit_worker`) for one epoch.
   Rank 0 returns the model and optimizer state as safetensors bytes; the driver
   loads them and ships them with the next epoch's stage. Cache the DataFrame
   (``df.cache()``) so later epochs do not re-run its lineage.

A barrier stage has exactly one task per partition and Spark refuses narrowing
(``coalesce``) inside it, so a DataFrame with ``partitions != workers`` is
``repartition(workers)``-ed (logged; pass ``df.repartition(workers).cache()`` to
pay that shuffle once). Partitions of unequal size are fine: the loop's per-step
MIN all-reduce stops every rank when the first runs out of rows (logged), so the
synchronous collectives never wait for a rank that has left.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import pyarrow as pa
import torch

from ..data.arrow import ArrowConverter
from ..data.base import WorkerData
from ..data.parquet import ParquetData
from ..data.shuffle import rebatch, seeded_generator
from ..errors import ConfigError, DataError
from ..train.jobs import in_task
from ..train.loop import FitSpec, fit_worker
from ..train.report import WorkerReport
from .board import BoardLink
from .cluster import is_connect
from .launcher import BarrierStage, rendezvous_board
from .task import rendezvous
from .worker_errors import encode_error

log = logging.getLogger(__name__)

_OUT_SCHEMA = "rank long, info string, state binary, optimizer_state binary"
_PLAIN_ATTR = re.compile(r"^[^\s()]+#\d+L?$")


def parquet_scan_files(df) -> list[str] | None:
    """The files of ``df`` when it is a plain Parquet scan with at most a column selection, else None.

    The optimized logical plan must consist of ``Project [col#id, ...]`` (plain
    column references, no expressions) over a ``Relation [...] parquet``;
    anything else (filters, joins, casts, UDFs, Spark Connect) returns None and
    the DataFrame is streamed through Spark instead.
    """
    try:
        plan = df._jdf.queryExecution().optimizedPlan().toString()
    except Exception:  # noqa: BLE001 - Spark Connect or a different JVM API: simply not detectable
        return None
    for line in plan.splitlines():
        node = line.strip().lstrip(":+- ").strip()
        if not node:
            continue
        if node.startswith("Project [") and node.endswith("]"):
            if not all(_PLAIN_ATTR.match(item.strip()) for item in node[len("Project [") : -1].split(",")):
                return None
        elif not (node.startswith("Relation ") and node.endswith(" parquet")):
            return None
    files = list(df.inputFiles())
    return files or None


def _local_paths(files: list[str]) -> list[str]:
    return [f[len("file:") :].replace("///", "/", 1) if f.startswith("file:") else f for f in files]


class StreamData(WorkerData):
    """One epoch of this task's partition, streamed from ``mapInArrow``'s record batches.

    Built on the driver without a stream (then pickled into the task), attached
    to the task's iterator there. ``batches`` can run once: the stream is consumed.
    """

    equal_batches = False  # partitions differ in size: the loop checks per step

    def __init__(self, converter: ArrowConverter, shuffle_buffer: int) -> None:
        self.converter = converter
        self.shuffle_buffer = int(shuffle_buffer)
        self._stream: Iterator[pa.RecordBatch] | None = None

    def attach(self, stream: Iterator[pa.RecordBatch]) -> StreamData:
        self._stream = stream
        return self

    def batches(
        self, *, rank: int, world_size: int, epoch: int, batch_size: int, seed: int, shuffle: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._stream is None:
            raise RuntimeError("StreamData.batches ran without a stream (or twice in one stage)")
        stream, self._stream = self._stream, None
        chunks = (self.converter.convert(rb) for rb in stream if rb.num_rows)
        batches = rebatch(
            chunks,
            batch_size,
            buffer_rows=self.shuffle_buffer if shuffle else 0,
            generator=seeded_generator(seed, epoch, rank),
        )
        yield from (
            map(self.converter.pack, batches)
            if self.converter.dict_batches  # type: ignore[misc]  # rebatch yields tuple[Tensor, ...]: these chunks are (features, labels)
            else batches
        )

    def counters(self) -> dict[str, int]:
        return {"dropped_null_rows": self.converter.dropped}

    def describe(self) -> str:
        return f"a Spark DataFrame streamed per partition; {self.converter.describe()}"


class DataFrameSource:
    """Driver-side handle of a DataFrame to stream: the projected frame and its converter."""

    def __init__(self, df, converter: ArrowConverter, shuffle_buffer: int, cached: bool = False) -> None:
        self.df = df
        self.cached = cached
        self.converter = converter
        self.shuffle_buffer = shuffle_buffer
        self.partitioned, self.workers = df, 0  # set by prepare

    def prepare(self, workers: int, epochs: int) -> None:
        """Partition the frame once for ``workers`` (as even as a stage needs) before the first epoch."""
        self.partitioned, self.workers = _partitioned(self, workers, epochs), workers

    def stage_frame(self, workers: int):
        """The frame one epoch's stage reads on ``workers`` (fewer than prepared: repartitioned)."""
        return self.partitioned if workers == self.workers else self.partitioned.repartition(workers)

    def sample(self, rows: int = 2) -> pa.RecordBatch:
        table = self.df.limit(rows).toArrow()
        if table.num_rows == 0:
            raise DataError(
                "the DataFrame is empty (0 rows); nothing to train on. Check the filters upstream."
            )
        return table.to_batches()[0]

    def num_samples(self) -> None:
        return None

    def describe(self) -> str:
        return StreamData(self.converter, self.shuffle_buffer).describe()


def dataframe_data(
    df,
    *,
    features: str | Sequence[str],
    label: str | None,
    feature_shape=None,
    drop_nulls: bool = False,
    shuffle_buffer: int = 10_000,
    dict_batches: bool = False,
) -> ParquetData | DataFrameSource:
    """Route a DataFrame to :class:`ParquetData` (plain Parquet scan) or to per-epoch streaming."""
    columns = [features] if isinstance(features, str) else list(features or [])
    wanted = columns + ([label] if label else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise DataError(
            f"column(s) {missing} not in the DataFrame. Available columns: {', '.join(df.columns)}. "
            "Pass features=/label= naming existing columns."
        )
    files = parquet_scan_files(df)
    if files is not None:
        try:
            data = ParquetData(
                _local_paths(files),
                features=features,
                label=label,
                feature_shape=feature_shape,
                drop_nulls=drop_nulls,
                shuffle_buffer=shuffle_buffer,
                dict_batches=dict_batches,
            )
            log.info(
                "the DataFrame is a plain Parquet scan of %d file(s): workers read the files directly",
                len(files),
            )
            return data
        except DataError as exc:  # e.g. a partition column that lives in directory names, not in files
            log.info("reading the Parquet files directly is not possible (%s); streaming through Spark", exc)
    projected = df.select(*wanted)
    schema = projected.limit(0).toArrow().schema
    converter = ArrowConverter(
        schema, features, label, feature_shape=feature_shape, drop_nulls=drop_nulls, dict_batches=dict_batches
    )
    level = df.storageLevel
    return DataFrameSource(projected, converter, shuffle_buffer, cached=level.useMemory or level.useDisk)


#: row groups of a DataFrame written for per-step fault tolerance: a worker caches whole ones
_ROW_GROUP_BYTES = 8 << 20


def write_parquet(source: DataFrameSource, path: str) -> ParquetData:
    """``source``'s projected frame written once to Parquet at ``path`` (a new directory), read
    back as :class:`ParquetData` with the same columns: its files and row groups are then a
    deterministic order of the rows, which ``fault_tolerance="step"``'s row cursor addresses
    (one Spark job; row groups of about 8 MiB, so a worker's cache of them stays small)."""
    source.df.write.option("parquet.block.size", _ROW_GROUP_BYTES).parquet(path)
    converter = source.converter
    data = ParquetData(
        path,
        features=[c.name for c in converter.features],
        label=converter.label.name if converter.label is not None else None,
        feature_shape=converter.feature_shape,
        drop_nulls=converter.drop_nulls,
        num_classes=converter.num_classes,
        shuffle_buffer=source.shuffle_buffer,
        dict_batches=converter.dict_batches,
    )
    data.converter.preview(data.sample())  # array widths and image sizes, learned as fit's checks learn them
    log.info("the DataFrame was written to Parquet once for per-step fault tolerance: %s", data.describe())
    return data


def _epoch_task(
    spec: FitSpec,
    threads: int | None,
    pg_timeout_s: float,
    restarts: tuple[int, int],
    board: BoardLink | None,
):
    """The function ``mapInArrow`` runs on each partition: one epoch of training on its stream."""

    def task(stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = None
        try:
            info = rendezvous(board=board)
            template = cast(StreamData, spec.train)  # epoch_stage's spec carries an unattached StreamData
            data = StreamData(template.converter, template.shuffle_buffer).attach(stream)
            job = in_task(
                lambda coll: fit_worker(replace(spec, train=data), coll),
                threads=threads,
                pg_timeout_s=pg_timeout_s,
                restarts=restarts,
            )
            out = job(info)
            for _ in stream:  # rows left after another rank ran out: drain so Spark's writer can finish
                pass
        except BaseException as exc:  # re-raised with a summary the driver decodes
            raise RuntimeError(encode_error(info.rank if info else -1, exc)) from None
        yield pa.RecordBatch.from_pydict(
            {  # ranks other than 0 return no report, or one holding only their share of the model
                "rank": [info.rank],
                "info": [out.summary_json() if out else "{}"],
                "state": [out.state if out else b""],
                "optimizer_state": [out.optimizer_state if out else b""],
            }
        )

    return task


def epoch_stage(
    spec: FitSpec,
    source: DataFrameSource,
    *,
    workers: int,
    spark,
    threads: int | None,
    pg_timeout_s: float,
    start_timeout_s: float,
    restarts: tuple[int, int] = (0, 0),
) -> WorkerReport:
    """Train epoch ``spec.part.start_epoch`` of ``source`` as one barrier ``mapInArrow`` stage on
    ``workers`` (``source.prepare`` first); rank 0's report, holding the whole model (the ranks'
    shares joined, ``WorkerReport.joined``). A failed worker raises
    ``WorkerFailed``: what happens next is the driver's (``driver.controller``). ``restarts``:
    the attempt's restart number and the job's ``max_restarts`` (``train.jobs.in_task``)."""
    stage_spec = replace(spec, train=StreamData(source.converter, source.shuffle_buffer))
    df = source.stage_frame(workers)
    epoch = spec.part.start_epoch
    with rendezvous_board(spark, workers) as board:
        task = _epoch_task(stage_spec, threads, pg_timeout_s, restarts, board.link if board else None)
        rows = _run_stage(
            df.mapInArrow(task, _OUT_SCHEMA, barrier=True), spark, workers, start_timeout_s, epoch
        )
    reports = {
        r["rank"]: WorkerReport.from_parts(r["info"], r["state"], r["optimizer_state"])
        for r in rows
        if r["info"] != "{}"  # a rank with no report
    }
    return WorkerReport.joined([reports.get(rank) for rank in range(workers)])


def _partitioned(source: DataFrameSource, workers: int, epochs: int):
    """The DataFrame with one partition per worker, as even as a stage needs."""
    df = source.df
    # a Connect session has no df.rdd: count the partitions with the rows (one cheap job)
    counts = _partition_rows(df) if is_connect(df.sparkSession) else None
    partitions = len(counts) if counts is not None else df.rdd.getNumPartitions()
    if partitions != workers:
        log.info(
            "the DataFrame has %d partition(s) for %d workers: repartitioning it to %d (a Spark shuffle "
            "every epoch; pass df.repartition(%d).cache() to shuffle only once)",
            partitions,
            workers,
            workers,
            workers,
        )
        df = df.repartition(workers)
    else:
        # One partition per worker as given. An empty or much smaller partition would end every
        # rank's epoch early (the per-step MIN check), so count rows once (a cheap job over a
        # cached DataFrame) and rebalance when the partitions are that uneven.
        counts = counts if counts is not None else _partition_rows(df)
        if sum(counts) == 0:
            raise DataError(
                "the DataFrame is empty (0 rows); nothing to train on. Check the filters upstream."
            )
        if min(counts) == 0 or max(counts) > 2 * min(counts) + 1:
            log.info(
                "the DataFrame's %d partitions are uneven (rows per partition: %s): repartitioning to %d "
                "so no worker runs out early",
                workers,
                counts,
                workers,
            )
            df = df.repartition(workers)
    if epochs > 1 and not source.cached:
        log.info(
            "the DataFrame is not cached: its lineage runs again in each of the %d epochs; call "
            "df.cache() first to avoid that",
            epochs,
        )
    return df


def _partition_rows(df) -> list[int]:
    """Rows per partition, counted by the executors (nothing but the counts reaches the driver)."""

    def count(stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        rows = sum(rb.num_rows for rb in stream)
        task = TaskContext.get()
        assert task is not None  # runs in a Spark task
        yield pa.RecordBatch.from_pydict({"p": [task.partitionId()], "n": [rows]})

    return [r["n"] for r in sorted(df.mapInArrow(count, "p long, n long").collect(), key=lambda r: r["p"])]


def _run_stage(out_df, spark, workers: int, start_timeout_s: float, epoch: int) -> list[dict[str, Any]]:
    """Collect a barrier ``mapInArrow`` stage (the same contract as ``run_barrier``)."""
    stage = BarrierStage(
        spark,
        workers,
        description=f"sparkdp training epoch {epoch + 1} on a DataFrame",
        start_timeout_s=start_timeout_s,
    )
    rows = stage.run(lambda: [r.asDict() for r in out_df.collect()])
    if not rows:
        raise ConfigError("the training stage returned no result; is the DataFrame's partition count 0?")
    return rows
