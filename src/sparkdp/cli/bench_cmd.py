"""``sparkdp bench``: run a strategies × workers × seeds matrix and write records, a table and plots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ConfigError


def _ints(low: int):
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers such as 2,4; got {text!r}"
            ) from None
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"expected integers >= {low}; got {text!r}")
        return values

    return parse


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="compare strategies side by side on a named workload",
        description="Train every strategy x worker count x seed on a workload, one JSON line per run "
        "(--json-out), then a table (mean ± sd over seeds) and plots in --out.",
        epilog="example:\n  sparkdp bench --workload fashion-mnist-mlp --strategies asgd dcasgd-c ddcasgd "
        "--workers 4,8 --seeds 0,1,2 --epochs 3 --limit 20000 --slow 1,3:3 --master 'local[8]' --out out/delay",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workload",
        default="fashion-mnist-mlp",
        help="fashion-mnist-cnn, fashion-mnist-mlp or comm-bound (default fashion-mnist-mlp)",
    )
    p.add_argument(
        "--strategies",
        nargs="+",
        default=["allreduce", "average:period=8", "asgd"],
        metavar="NAME[:KEY=VALUE...]",
        help="strategies with options (default: allreduce average:period=8 asgd)",
    )
    p.add_argument("--workers", type=_ints(1), default=[2], help="worker counts, comma-separated (default 2)")
    p.add_argument("--seeds", type=_ints(0), default=[0], help="seeds, comma-separated (default 0)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    p.add_argument("--limit", type=int, help="training rows (default: the whole dataset)")
    p.add_argument(
        "--slow",
        metavar="RANKS:FACTOR",
        help="make these workers FACTOR times slower per step, e.g. 1,3:3 (heterogeneous machines)",
    )
    p.add_argument(
        "--master", help="Spark master (async runs with more workers than slots need e.g. local[8])"
    )
    p.add_argument("--out", default="out/bench", help="directory for runs.jsonl, results.md and results.png")
    p.add_argument("--json-out", help="JSON-lines file of the runs (default OUT/runs.jsonl; appended to)")
    p.add_argument(
        "--budget-min",
        type=float,
        default=30.0,
        help="ask for --yes when the estimated time exceeds this many minutes (default 30)",
    )
    p.add_argument("--yes", action="store_true", help="run even when the estimate exceeds --budget-min")
    p.add_argument(
        "--summarise",
        nargs="*",
        metavar="RUNS.jsonl",
        help="only build the table and plots from existing JSON-lines files",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..driver import bench

    out = Path(args.out)
    if args.summarise is not None:
        records = bench.read_records([Path(p) for p in args.summarise] or [out / "runs.jsonl"])
        return _write_summary(bench, records, out)
    work = bench.workload(args.workload)
    choices = [bench.StrategyChoice.parse(s) for s in args.strategies]
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be >= 1; got {args.epochs}")
    runs = len(choices) * len(args.workers) * len(args.seeds)
    estimate = bench.planned(work, runs, args.epochs, args.limit)
    print(
        f"{runs} runs of {work.name}, about {estimate / 60:.0f} min (estimated from this project's reference "
        "machine)",
        file=sys.stderr,
    )
    if estimate > args.budget_min * 60 and not args.yes:
        raise ConfigError(
            f"the matrix would take about {estimate / 60:.0f} min, more than --budget-min "
            f"{args.budget_min:g}; shrink it (fewer seeds/workers, --limit, --epochs) or pass --yes"
        )
    import sparkdp

    master = args.master or f"local[{max(args.workers)}]"
    spark = sparkdp.session(master, log_level="OFF")
    records = bench.run_matrix(
        work,
        choices,
        args.workers,
        args.seeds,
        epochs=args.epochs,
        limit=args.limit,
        spark=spark,
        out=Path(args.json_out) if args.json_out else out / "runs.jsonl",
        slow=args.slow,
    )
    return _write_summary(bench, records, out)


def _write_summary(bench, records, out: Path) -> int:
    from ..files import atomic_write

    rows = bench.summarise(records)
    if not rows:
        print("no successful runs to summarise", file=sys.stderr)
        return 1
    table = bench.markdown(rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "results.md", lambda tmp: Path(tmp).write_text(table))
    png = bench.plot(records, rows, out / "results.png")
    print(table + f"\ntable: {out / 'results.md'}; plots: {png}")
    return 0
