"""What one worker reads of a Parquet dataset per epoch under ``fault_tolerance="step"``, against
the restart mode's reading of the same file.

One process, one thread (a worker owns one core). A Parquet file of ``--rows`` rows of
``--width`` float32 features and an integer label, in row groups of ``--row-group`` rows, is
read for one epoch as rank 0 of ``--workers``:

* restart mode: ``ParquetData.batches`` (rank 0's contiguous row range, a shuffle buffer);
* step mode, the quorum whole: rank 0's share of every step (``RowCursor.my_rows`` over the
  data's ``LaneOrder``), read with ``ParquetData.rows_at``;
* step mode after a leave: rank 0 of ``workers - 1`` (the survivors cover the lost lane too).

For each: rows/s of the worker's own rows, the row groups it read, and (step mode) the most
rows its cache held.

    python benchmarks/step_parquet_read.py --rows 200000 --width 64 --row-group 5000 --workers 4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from sparkdp.data.parquet import ParquetData
from sparkdp.train.row_cursor import RowCursor


def write(path: Path, rows: int, width: int, row_group: int) -> None:
    rng = np.random.default_rng(0)
    features = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.standard_normal(rows * width, dtype=np.float32)), width
    )
    pq.write_table(pa.table({"x": features, "y": np.arange(rows) % 10}), path, row_group_size=row_group)


def restart_mode(data: ParquetData, workers: int, batch: int) -> dict[str, float]:
    started, rows = time.perf_counter(), 0
    for x, _ in data.batches(rank=0, world_size=workers, epoch=0, batch_size=batch, seed=1):
        rows += len(x)
    segments = data.segments(rank=0, world_size=workers, epoch=0, seed=1, shuffle=True)
    return {"rows": rows, "rows_per_s": rows / (time.perf_counter() - started), "row_groups": len(segments)}


def step_mode(data: ParquetData, workers: int, world: int, batch: int) -> dict[str, float]:
    cursor = RowCursor(data.rows, batch * workers, 1, seed=1, lanes=workers)
    order = cursor.order(0, data)
    started, rows, most = time.perf_counter(), 0, 0
    for step in range(cursor.steps_per_epoch):
        x, _ = data.rows_at(cursor.my_rows(step, 0, world, order))
        rows += len(x)
        most = max(most, sum(len(c[0]) for c in data.row_reader.cache.values()))
    return {
        "rows": rows,
        "rows_per_s": rows / (time.perf_counter() - started),
        "row_groups": data.row_reader.units_read,
        "cache_rows_max": most,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--row-group", type=int, default=5_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shuffle-buffer", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="sparkdp-bench-") as tmp:
        path = Path(tmp) / "data.parquet"
        write(path, args.rows, args.width, args.row_group)

        def data() -> ParquetData:
            return ParquetData(str(path), features="x", label="y", shuffle_buffer=args.shuffle_buffer)

        out = {
            "row_groups": len(data().units),
            "restart": restart_mode(data(), args.workers, args.batch_size),
            "step_whole": step_mode(data(), args.workers, args.workers, args.batch_size),
            "step_after_a_leave": step_mode(data(), args.workers, args.workers - 1, args.batch_size),
        }
    print(json.dumps({"args": vars(args), **out}, indent=1))


if __name__ == "__main__":
    main()
