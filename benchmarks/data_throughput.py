"""How fast sparkdp feeds trainers from Parquet, against a plain pyarrow read (a benchmark, not a test).

Generates a Parquet dataset on the fly (default 1,000,000 rows x 512 float32
features + an int64 label, about 2 GB) in a temporary directory, then in one run:

  (a) reads it with plain pyarrow into numpy, batch by batch (one process) -> MB/s;
  (b) trains one sparkdp epoch of a linear model on it with 2 Spark workers
      (``sparkdp.fit(model, path, features="x", label="y")``: the workers read their
      row groups directly) -> MB/s delivered to the trainers;
  (c) optionally (``--stream``) the same epoch through Spark itself
      (``spark.read.parquet(p).filter(...)``, streamed with barrier ``mapInArrow``).

Peak resident memory of the Python driver, the JVM and every Python worker is
sampled with psutil over the whole process tree every 50 ms. The directory is
deleted at the end.

    python benchmarks/data_throughput.py               # the full 2 GB run
    python benchmarks/data_throughput.py --rows 100000 --repeats 1  # a quick one

(a) and (b) run ``--repeats`` times (default 3), interleaved, and medians are reported:
this machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

MB = 1e6


class PeakRss:
    """Samples the RSS of this process and all its descendants; keeps each one's peak."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peaks: dict[int, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in [me] + me.children(recursive=True):
                try:
                    rss = proc.memory_info().rss
                    if rss > self.peaks.get(proc.pid, (0, ""))[0]:
                        self.peaks[proc.pid] = (rss, _role(proc, me))
                except psutil.Error:
                    continue
            self._stop.wait(self.interval)


def _role(proc: psutil.Process, me: psutil.Process) -> str:
    if proc.pid == me.pid:
        return "python driver"
    if "java" in proc.name():
        return "JVM (Spark driver + local executor)"
    try:
        parent = proc.parent()
    except psutil.Error:
        parent = None
    if parent is not None and "java" in parent.name():
        return "pyspark daemon"  # workers are forked from it and share its command line
    return "python worker"


def generate(path: str, rows: int, features: int, files: int, row_group: int) -> int:
    """Write ``rows`` random rows as ``files`` Parquet files; return the payload bytes (x + y)."""
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(features, 10)).astype(np.float32)
    per_file = -(-rows // files)
    schema = pa.schema([("x", pa.list_(pa.float32())), ("y", pa.int64())])
    written = 0
    for f in range(files):
        n_file = min(per_file, rows - written)
        if n_file <= 0:
            break
        with pq.ParquetWriter(os.path.join(path, f"part-{f:05d}.parquet"), schema) as writer:
            for start in range(0, n_file, row_group):
                n = min(row_group, n_file - start)
                x = rng.standard_normal((n, features), dtype=np.float32)
                y = (x @ weights).argmax(1).astype(np.int64)
                xs = pa.ListArray.from_arrays(
                    pa.array(np.arange(0, n * features + 1, features, dtype=np.int32)),
                    pa.array(x.reshape(-1)),
                )
                writer.write_table(pa.table({"x": xs, "y": y}, schema=schema), row_group_size=row_group)
        written += n_file
    return rows * (features * 4 + 8)


def plain_pyarrow(path: str, features: int, batch_rows: int) -> tuple[float, int]:
    """Seconds and rows for reading every file into numpy arrays batch by batch."""
    started, rows = time.perf_counter(), 0
    for name in sorted(os.listdir(path)):
        with pq.ParquetFile(os.path.join(path, name)) as f:
            for rb in f.iter_batches(batch_size=batch_rows, columns=["x", "y"]):
                x = rb.column(0).flatten().to_numpy().reshape(-1, features)
                y = rb.column(1).to_numpy()
                rows += len(x) + 0 * int(y[:1].sum())
    return time.perf_counter() - started, rows


def _merge_peaks(into: dict[str, float], sampler: PeakRss) -> None:
    """Keep, per role, the highest peak seen; workers are numbered by pid order within a run."""
    workers = sorted(pid for pid, (_peak, role) in sampler.peaks.items() if role == "python worker")
    for pid, (peak, role) in sampler.peaks.items():
        if role == "pyspark daemon":
            continue
        key = f"python worker {workers.index(pid) + 1}" if role == "python worker" else role
        into[key] = max(into.get(key, 0), peak)


def sparkdp_epoch(data, spark, features: int, workers: int, batch_size: int, **kw):
    import torch

    import sparkdp

    torch.manual_seed(0)
    model = torch.nn.Linear(features, 10)
    started = time.perf_counter()
    result = sparkdp.fit(
        model,
        data,
        features="x",
        label="y",
        workers=workers,
        epochs=1,
        batch_size=batch_size,
        spark=spark,
        show_progress=False,
        optimizer_options={"lr": 0.01},
        **kw,
    )
    return result, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group", type=int, default=32_768)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--read-rows", type=int, default=8192, help="rows per Arrow batch read")
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved (a)/(b) pairs; medians are reported"
    )
    parser.add_argument("--stream", action="store_true", help="also run (c): the DataFrame streamed by Spark")
    parser.add_argument(
        "--dir", default=None, help="where to create the temporary dataset (default: $TMPDIR)"
    )
    args = parser.parse_args(argv)

    path = tempfile.mkdtemp(prefix="sparkdp-bench-", dir=args.dir)
    spark = None
    try:
        t0 = time.perf_counter()
        payload = generate(path, args.rows, args.features, args.files, args.row_group)
        on_disk = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        print(
            f"generated {args.rows:,} rows x {args.features} float32 + int64 label: "
            f"{payload / 1e9:.2f} GB payload, {on_disk / 1e9:.2f} GB on disk in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        plain_pyarrow(path, args.features, args.read_rows)  # warm the page cache for both measurements

        import sparkdp
        from sparkdp.data.parquet import ParquetData

        spark = sparkdp.session(f"local[{args.workers}]", app_name="sparkdp-bench")
        data = ParquetData(path, features="x", label="y", read_rows=args.read_rows)
        plain_runs: list[float] = []
        runs: dict[str, list[tuple[float, float, float]]] = {"(b) Parquet read by workers": []}
        peaks: dict[str, dict[str, float]] = {"(b) Parquet read by workers": {}}
        for rep in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
            plain_s, rows = plain_pyarrow(path, args.features, args.read_rows)
            assert rows == args.rows
            plain_runs.append(payload / MB / plain_s)
            with PeakRss() as rss:  # every fit starts fresh workers: the first-epoch costs count each time
                result, wall = sparkdp_epoch(data, spark, args.features, args.workers, args.batch_size)
            epoch_s = result.history[0]["epoch_time_s"]
            delivered = result.history[0]["samples"] * (args.features * 4 + 8) / MB / epoch_s
            runs["(b) Parquet read by workers"].append((delivered, epoch_s, wall))
            _merge_peaks(peaks["(b) Parquet read by workers"], rss)
            print(
                f"[{rep + 1}/{args.repeats}] (a) plain pyarrow {plain_runs[-1]:,.0f} MB/s; (b) sparkdp epoch "
                f"{epoch_s:.1f} s in the loop, {wall:.1f} s wall, {delivered:,.0f} MB/s delivered",
                flush=True,
            )
        if args.stream:
            name = "(c) DataFrame streamed by Spark"
            df = spark.read.parquet(path).filter("y >= 0")  # not a plain scan: streamed through Spark
            with PeakRss() as rss_c:
                result_c, wall_c = sparkdp_epoch(df, spark, args.features, args.workers, args.batch_size)
            epoch_c = result_c.history[0]["epoch_time_s"]
            runs[name] = [
                (result_c.history[0]["samples"] * (args.features * 4 + 8) / MB / epoch_c, epoch_c, wall_c)
            ]
            peaks[name] = {}
            _merge_peaks(peaks[name], rss_c)
        plain = statistics.median(plain_runs)
        print()
        print(f"medians of {args.repeats} interleaved run(s)\n")
        print("| measurement | value |\n|---|---|")
        print(
            f"| dataset | {args.rows:,} rows x {args.features} float32 + label, {payload / 1e9:.2f} GB "
            f"({on_disk / 1e9:.2f} GB on disk, {args.files} files, row groups of {args.row_group:,}) |"
        )
        print(
            f"| (a) plain pyarrow -> numpy, 1 process | {plain:,.0f} MB/s "
            f"(runs: {', '.join(f'{v:,.0f}' for v in plain_runs)}) |"
        )
        for name, values in runs.items():
            mbs = statistics.median(v[0] for v in values)
            print(
                f"| {name}, {args.workers} workers | {mbs:,.0f} MB/s delivered = {mbs / plain:.2f}x plain "
                f"(runs: {', '.join(f'{v[0]:,.0f}' for v in values)} MB/s; epoch "
                f"{statistics.median(v[1] for v in values):.1f} s, fit wall {statistics.median(v[2] for v in values):.1f} s) |"
            )
            for role, peak in sorted(peaks[name].items()):
                print(f"| {name}: peak RSS, {role} (max over runs) | {peak / 1e9:.2f} GB |")
        print(f"| python | {sys.version.split()[0]}, {os.cpu_count()} CPUs |")
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
