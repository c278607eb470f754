"""The driver JVM's compilers on a local session: ``sparkdp.session(jit="quick")`` (C1 only, the
default on local masters) against ``jit="full"`` (the JVM's tiered C1 + C2), both sides of the trade.

Each child process starts a ``local[2]`` session with one of them and runs, in order:

  start     a short synchronous job: the CNN on the first --rows Fashion-MNIST rows held in
            memory, 2 workers, one epoch; what counts is the child's time outside training
            (its wall clock from launch to the fit's return, less the training time)
  again     the same job once more on the same session (its fit() less its training time)
  stream    a DataFrame streamed through Spark (a filtered Parquet scan, so the JVM reads and
            converts every row to Arrow each epoch): --stream-rows Fashion-MNIST rows, a linear
            model, --stream-epochs epochs; what counts is each epoch's time, where the JVM's
            code is the bottleneck

The two modes run interleaved (quick full quick full ...), --repeats times; medians are reported.

Run:  python benchmarks/jvm_compilers.py                  # 3 repeats
      python benchmarks/jvm_compilers.py --repeats 1 --stream-rows 20000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import child_way, markdown_table, median, run_way  # noqa: E402

MODES = ("quick", "full")


def _write_parquet(path: str, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkdp.data import load_dataset

    ds = load_dataset("fashion-mnist", limit=rows)
    pixels = ds.x_train.reshape(len(ds.x_train), -1)
    column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), pixels.shape[1]).cast(
        pa.list_(pa.float32())
    )
    pq.write_table(pa.table({"pixels": column, "label": pa.array(ds.y_train, pa.int64())}), path)


def _child(cfg: dict, marks: dict) -> dict:
    import torch
    from torch import nn

    import sparkdp
    from sparkdp.data import load_dataset
    from sparkdp.models.zoo import build_model

    started = time.time()
    spark = sparkdp.session("local[2]", jit=cfg["jit"])
    session_s = time.time() - started
    ds = load_dataset("fashion-mnist", limit=cfg["rows"])

    def short_job():
        torch.manual_seed(0)
        return sparkdp.fit(
            build_model("cnn"),
            (ds.x_train, ds.y_train),
            eval_data=(ds.x_test, ds.y_test),
            optimizer="sgd",
            optimizer_options={"lr": 0.05, "momentum": 0.9},
            workers=2,
            epochs=1,
            batch_size=64,
            seed=0,
            spark=spark,
            show_progress=False,
        )

    first = short_job()
    outside = time.time() - cfg["launch_time"] - first.train_time_s
    started = time.time()
    second = short_job()
    second_outside = time.time() - started - second.train_time_s
    started = time.time()
    streamed = sparkdp.fit(
        nn.Sequential(nn.Flatten(), nn.Linear(784, 10)),
        spark.read.parquet(cfg["parquet"]).where("label >= 0"),  # not a plain scan: through Spark
        features="pixels",
        label="label",
        optimizer="sgd",
        optimizer_options={"lr": 0.05},
        workers=2,
        epochs=cfg["stream_epochs"],
        batch_size=256,
        spark=spark,
        show_progress=False,
    )
    streamed_wall = time.time() - started
    spark.stop()
    return {
        "session_s": session_s,
        "start_outside_training_s": outside,
        "second_outside_training_s": second_outside,
        "stream_fit_wall_s": streamed_wall,
        "stream_epoch_s": [h["epoch_time_s"] for h in streamed.history],
        "stream_rows_per_s": streamed.samples_per_s,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=6000, help="the short job's training rows")
    p.add_argument("--stream-rows", type=int, default=60000)
    p.add_argument("--stream-epochs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per child process")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        cfg = json.loads(args.config)
        launched = cfg["launch_time"]  # child_way takes it out of the config it passes on
        return child_way(args.child, cfg, lambda c, m: _child({**c, "launch_time": launched}, m))
    if min(args.repeats, args.rows, args.stream_rows, args.stream_epochs) < 1:
        p.error("--repeats, --rows, --stream-rows and --stream-epochs must be at least 1")

    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="sparkdp-jit-") as tmp:
        parquet = os.path.join(tmp, "rows.parquet")
        _write_parquet(parquet, args.stream_rows)
        for rep in range(args.repeats):
            for mode in MODES:
                cfg = {
                    "jit": mode,
                    "rows": args.rows,
                    "parquet": parquet,
                    "stream_epochs": args.stream_epochs,
                }
                runs[mode].append(
                    run_way(
                        __file__,
                        mode,
                        cfg,
                        label=f"jit={mode}",
                        timeout_s=args.timeout,
                        log_dir=tmp,
                        tag=str(rep),
                    )
                )
        rows = []
        for mode in MODES:
            good = [r for r in runs[mode] if r.get("ok")]
            # the first streamed epoch also plans the query; the later ones are the steady state
            later = [median(r["stream_epoch_s"][1:]) for r in good if len(r["stream_epoch_s"]) > 1]
            rows.append(
                [
                    f"jit={mode}",
                    f"{len(good)}/{len(runs[mode])}",
                    median(r["session_s"] for r in good),
                    median(r["start_outside_training_s"] for r in good),
                    median(r["second_outside_training_s"] for r in good),
                    median(r["stream_epoch_s"][0] for r in good),
                    median(later),
                    median(r["stream_fit_wall_s"] for r in good),
                    median(r["wall_s"] for r in good),
                ]
            )
        print(
            markdown_table(
                [
                    "compilers",
                    "runs ok",
                    "session (s)",
                    "1st short job: outside training (s)",
                    "2nd short job: outside training (s)",
                    "streamed: 1st epoch (s)",
                    "streamed: later epochs (s)",
                    "streamed: fit() (s)",
                    "the child in all (s)",
                ],
                rows,
            )
        )
        print(json.dumps({"runs": runs, "args": vars(args)}, default=str), file=sys.stderr)
    return 0 if all(r.get("ok") for recs in runs.values() for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
