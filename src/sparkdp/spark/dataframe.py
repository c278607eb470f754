"""Spark DataFrames as training data, streamed where they live.

Two routes, chosen per DataFrame:

1. **A plain Parquet scan** (``spark.read.parquet(p)`` with at most a column
   selection): the workers read the files themselves (:class:`ParquetData`), so
   every epoch re-reads the files and nothing passes through Spark's executors.
2. **Anything else** (joins, UDFs, VectorAssembler output, in-memory frames): one
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

import copy
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import pyarrow as pa
import torch

from ..data.arrow import ArrowConverter
from ..data.base import WorkerData
from ..data.parquet import ParquetData
from ..data.shuffle import rebatch, seeded_generator
from ..errors import ConfigError, DataError, WorkerFailed
from ..state import state_from_bytes
from ..train.checkpoint import CheckpointPolicy, save_checkpoint
from ..train.faults import fault_from_env
from ..train.jobs import in_task
from ..train.loop import FitSpec, StagePart, fit_worker
from ..train.report import WorkerReport
from .cluster import is_connect
from .launcher import BarrierStage
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
            if not all(_PLAIN_ATTR.match(item.strip()) for item in node[len("Project ["):-1].split(",")):
                return None
        elif not (node.startswith("Relation ") and node.endswith(" parquet")):
            return None
    files = list(df.inputFiles())
    return files or None


def _local_paths(files: list[str]) -> list[str]:
    return [f[len("file:"):].replace("///", "/", 1) if f.startswith("file:") else f for f in files]


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

    def batches(self, *, rank: int, world_size: int, epoch: int, batch_size: int,
                seed: int, shuffle: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._stream is None:
            raise RuntimeError("StreamData.batches ran without a stream (or twice in one stage)")
        stream, self._stream = self._stream, None
        chunks = (self.converter.convert(rb) for rb in stream if rb.num_rows)
        batches = rebatch(chunks, batch_size, buffer_rows=self.shuffle_buffer if shuffle else 0,
                          generator=seeded_generator(seed, epoch, rank))
        yield from (map(self.converter.pack, batches) if self.converter.dict_batches  # type: ignore[misc]  # rebatch yields tuple[Tensor, ...]: these chunks are (features, labels)
                    else batches)

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

    def sample(self, rows: int = 2) -> pa.RecordBatch:
        table = self.df.limit(rows).toArrow()
        if table.num_rows == 0:
            raise DataError("the DataFrame is empty (0 rows); nothing to train on. Check the filters upstream.")
        return table.to_batches()[0]

    def num_samples(self) -> None:
        return None

    def describe(self) -> str:
        return StreamData(self.converter, self.shuffle_buffer).describe()


def dataframe_data(df, *, features: str | Sequence[str], label: str | None, feature_shape=None,
                   drop_nulls: bool = False, shuffle_buffer: int = 10_000,
                   dict_batches: bool = False) -> ParquetData | DataFrameSource:
    """Route a DataFrame to :class:`ParquetData` (plain Parquet scan) or to per-epoch streaming."""
    columns = [features] if isinstance(features, str) else list(features or [])
    wanted = columns + ([label] if label else [])
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise DataError(f"column(s) {missing} not in the DataFrame. Available columns: {', '.join(df.columns)}. "
                        "Pass features=/label= naming existing columns.")
    files = parquet_scan_files(df)
    if files is not None:
        try:
            data = ParquetData(_local_paths(files), features=features, label=label, feature_shape=feature_shape,
                               drop_nulls=drop_nulls, shuffle_buffer=shuffle_buffer, dict_batches=dict_batches)
            log.info("the DataFrame is a plain Parquet scan of %d file(s): workers read the files directly",
                     len(files))
            return data
        except DataError as exc:  # e.g. a partition column that lives in directory names, not in files
            log.info("reading the Parquet files directly is not possible (%s); streaming through Spark", exc)
    projected = df.select(*wanted)
    schema = projected.limit(0).toArrow().schema
    converter = ArrowConverter(schema, features, label, feature_shape=feature_shape, drop_nulls=drop_nulls,
                               dict_batches=dict_batches)
    level = df.storageLevel
    return DataFrameSource(projected, converter, shuffle_buffer, cached=level.useMemory or level.useDisk)


def _epoch_task(spec: FitSpec, threads: int | None, pg_timeout_s: float):
    """The function ``mapInArrow`` runs on each partition: one epoch of training on its stream."""

    def task(stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        info = None
        try:
            info = rendezvous()
            template = cast(StreamData, spec.train)  # fit_stream's stage spec carries an unattached StreamData
            data = StreamData(template.converter, template.shuffle_buffer).attach(stream)
            job = in_task(lambda coll: fit_worker(replace(spec, train=data), coll), threads=threads,
                          pg_timeout_s=pg_timeout_s)
            out = job(info)
            for _ in stream:  # rows left after another rank ran out: drain so Spark's writer can finish
                pass
        except BaseException as exc:  # re-raised with a summary the driver decodes
            raise RuntimeError(encode_error(info.rank if info else -1, exc)) from None
        yield pa.RecordBatch.from_pydict({  # ranks other than 0 return no report
            "rank": [info.rank], "info": [out.summary_json() if out else "{}"],
            "state": [out.state if out else b""], "optimizer_state": [out.optimizer_state if out else b""],
        })

    return task


def fit_stream(spec: FitSpec, source: DataFrameSource, *, workers: int, spark, threads: int | None,
               pg_timeout_s: float, start_timeout_s: float, restarts: Any = None,
               checkpoint: CheckpointPolicy | None = None,
               slots: Callable[[], int | None] = lambda: None) -> tuple[WorkerReport, int]:
    """Train ``spec.epochs`` epochs on ``source``, one barrier stage per epoch; rank 0's merged
    report and the workers the last epoch ran on.

    The driver holds the state at every epoch end, so a failed epoch stage is run again from
    there as ``restarts`` (the job's ``driver.recovery.RestartPolicy``; None: never) allows, on
    the workers it says (fewer when ``slots()`` shows task slots gone, back to ``workers`` at a
    later epoch when they return); ``checkpoint`` saves each epoch's state to a file. A spec
    resumed from a checkpoint (``spec.part``) starts at its epoch.
    """
    df = _partitioned(source, workers, spec.epochs)
    merged: WorkerReport | None = None
    opt_state = spec.part.optimizer_state
    template = StreamData(source.converter, source.shuffle_buffer)
    first, last = spec.part.start_epoch, spec.last_epoch()
    before = spec.part.history
    spec = replace(spec, strategy=copy.deepcopy(spec.strategy))  # the caller's object is not advanced
    fault, now = fault_from_env(), workers
    for epoch in range(first, last + 1):
        if now < workers:  # shrunk by an earlier failure: grow back when the slots have returned
            now = restarts.workers(workers, slots())
        part = StagePart(start_epoch=epoch, last_epoch=last, optimizer_state=opt_state, return_optimizer_state=True)
        while True:
            stage_spec = replace(spec, train=template, epochs=1, part=part, fault=fault)
            stage_df = df if now == workers else df.repartition(now)
            began = time.perf_counter()
            try:
                rows = _run_stage(stage_df.mapInArrow(_epoch_task(stage_spec, threads, pg_timeout_s), _OUT_SCHEMA,
                                                      barrier=True), spark, now, start_timeout_s, epoch)
                break
            except WorkerFailed as exc:
                if restarts is None:
                    raise
                now = restarts.recover(exc, workers, slots(), f"the start of epoch {epoch + 1}",
                                       attempt_s=time.perf_counter() - began)
                fault = None  # an injected fault fires in the first attempt only
        rank0 = next(r for r in rows if r["rank"] == 0)
        report = WorkerReport.from_parts(rank0["info"], rank0["state"], rank0["optimizer_state"])
        spec.model.load_state_dict(state_from_bytes(report.state))  # shipped with the next stage
        opt_state = report.optimizer_state or None
        # the next stage ships the strategy object: its schedule (e.g. the averaging period's
        # position) continues instead of restarting every epoch
        spec.strategy.load_state_dict(report.strategy_state)
        merged = report if merged is None else merged.then(report)
        if checkpoint is not None:
            save_checkpoint(checkpoint, epoch=epoch + 1, step=0, model=state_from_bytes(report.state),
                            optimizer=opt_state or b"", strategy_state=report.strategy_state, rng=[],
                            history=[*before, *merged.history], workers=now)
    assert merged is not None  # fit() checked epochs >= 1
    return merged, now


def _partitioned(source: DataFrameSource, workers: int, epochs: int):
    """The DataFrame with one partition per worker, as even as a stage needs."""
    df = source.df
    # a Connect session has no df.rdd: count the partitions with the rows (one cheap job)
    counts = _partition_rows(df) if is_connect(df.sparkSession) else None
    partitions = len(counts) if counts is not None else df.rdd.getNumPartitions()
    if partitions != workers:
        log.info("the DataFrame has %d partition(s) for %d workers: repartitioning it to %d (a Spark shuffle "
                 "every epoch; pass df.repartition(%d).cache() to shuffle only once)",
                 partitions, workers, workers, workers)
        df = df.repartition(workers)
    else:
        # One partition per worker as given. An empty or much smaller partition would end every
        # rank's epoch early (the per-step MIN check), so count rows once (a cheap job over a
        # cached DataFrame) and rebalance when the partitions are that uneven.
        counts = counts if counts is not None else _partition_rows(df)
        if sum(counts) == 0:
            raise DataError("the DataFrame is empty (0 rows); nothing to train on. Check the filters upstream.")
        if min(counts) == 0 or max(counts) > 2 * min(counts) + 1:
            log.info("the DataFrame's %d partitions are uneven (rows per partition: %s): repartitioning to %d "
                     "so no worker runs out early", workers, counts, workers)
            df = df.repartition(workers)
    if epochs > 1 and not source.cached:
        log.info("the DataFrame is not cached: its lineage runs again in each of the %d epochs; call "
                 "df.cache() first to avoid that", epochs)
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
    stage = BarrierStage(spark, workers, description=f"sparkdp training epoch {epoch + 1} on a DataFrame",
                         start_timeout_s=start_timeout_s)
    rows = stage.run(lambda: [r.asDict() for r in out_df.collect()])
    if not rows:
        raise ConfigError("the training stage returned no result; is the DataFrame's partition count 0?")
    return rows
