"""Asynchronous training throughput: sparkdp ``asgd`` / ``hogwild`` vs one PyTorch process.

The job: Fashion-MNIST, the 2-conv CNN of 16/32 channels + fc128 (``cnn-small``),
batch 64, 2 workers pushing and pulling **every batch**, 1 epoch. Each worker trains with
its own SGD (lr 0.05, no momentum) and the server applies the pushes with SGD lr 0.05.
In the same invocation a plain single-process PyTorch loop (2 threads, same model, batch
and optimizer) is timed on the same data. Training throughput = training rows per second
of training time (Spark start-up excluded for sparkdp; it is reported separately).
Ways run interleaved; with ``--repeats R`` the medians are reported.

Reference: Dpplee3 0.2.5 (Flask + pickle per batch) reached ~1,600 samples/s on
this job here, about a third of the single-process loop. Target: >= 1.0x single process.

Run:  python benchmarks/async_throughput.py [--repeats 3] [--limit N] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import markdown_table, median, pass_fail, ratio, write_json  # noqa: E402


def single_process(x, y, xt, yt, batch: int, seed: int) -> dict:
    import torch

    from sparkdp.models import build_model

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    model = build_model("cnn-small")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    started = time.perf_counter()
    for start in range(0, len(x), batch):
        idx = order[start : start + batch]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    elapsed = time.perf_counter() - started
    with torch.no_grad():
        acc = (model(xt).argmax(1) == yt).float().mean().item()
    return {"samples_per_s": len(x) / elapsed, "train_s": elapsed, "test_accuracy": acc}


def sparkdp_async(strategy: str, x, y, xt, yt, batch: int, seed: int, spark) -> dict:
    import torch

    import sparkdp
    from sparkdp.models import build_model

    torch.manual_seed(seed)
    model = build_model("cnn-small")
    started = time.perf_counter()
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(xt, yt),
        strategy=strategy,
        strategy_options={"rule_options": {"lr": 0.05}, "push_every": 1},
        optimizer="sgd",
        optimizer_options={"lr": 0.05, "momentum": 0.0},
        workers=2,
        epochs=1,
        batch_size=batch,
        seed=seed,
        spark=spark,
        show_progress=False,
    )
    server = result.details["server"]
    return {
        "samples_per_s": result.samples_per_s,
        "train_s": result.train_time_s,
        "wall_s": time.perf_counter() - started,
        "test_accuracy": result.test_accuracy,
        "pushes": server["pushes_applied"],
        "mean_staleness": _mean(server["staleness"]),
        "comm_s": sum(w["comm_s"] for w in result.details["per_worker"]),
    }


def _mean(hist: dict) -> float:
    n = sum(hist.values())
    return sum(int(k) * v for k, v in hist.items()) / n if n else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="use only the first N training rows")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json-out")
    args = p.parse_args(argv)

    import torch

    import sparkdp
    from sparkdp.data import load_dataset

    ds = load_dataset("fashion-mnist", limit=args.limit)
    x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    xt, yt = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
    t0 = time.perf_counter()
    spark = sparkdp.session("local[2]")
    session_s = time.perf_counter() - t0
    runs: dict[str, list[dict]] = {"single": [], "asgd": [], "hogwild": []}
    for rep in range(args.repeats):
        runs["single"].append(single_process(x, y, xt, yt, args.batch_size, rep))
        for name in ("asgd", "hogwild"):
            runs[name].append(sparkdp_async(name, x, y, xt, yt, args.batch_size, rep, spark))
        print(
            f"repeat {rep + 1}/{args.repeats}: "
            + ", ".join(f"{k} {v[-1]['samples_per_s']:,.0f}/s" for k, v in runs.items()),
            flush=True,
        )
    spark.stop()
    med = {k: {m: median(r.get(m) for r in v) for m in v[0]} for k, v in runs.items()}
    rows = [
        [
            k,
            med[k]["samples_per_s"],
            med[k]["train_s"],
            med[k].get("wall_s"),
            med[k]["test_accuracy"],
            med[k].get("pushes"),
            med[k].get("mean_staleness"),
            med[k].get("comm_s"),
        ]
        for k in runs
    ]
    print(
        f"\nrows {len(x):,}, batch {args.batch_size}, 1 epoch, repeats {args.repeats} (medians); "
        f"Spark session start {session_s:.1f} s\n"
    )
    print(
        markdown_table(
            ["way", "samples/s", "train s", "fit wall s", "test acc", "pushes", "mean tau", "worker comm s"],
            rows,
        )
    )
    checks = []
    for name in ("asgd", "hogwild"):
        r = ratio(med[name]["samples_per_s"], med["single"]["samples_per_s"])
        checks.append(
            [f"{name} / single-process throughput", r, ">= 1.0", pass_fail(r is not None and r >= 1.0)]
        )
    print()
    print(markdown_table(["check", "measured", "target", "result"], checks))
    if args.json_out:
        write_json(args.json_out, {"runs": runs, "medians": med, "session_s": session_s})
    return 0


if __name__ == "__main__":
    sys.exit(main())
