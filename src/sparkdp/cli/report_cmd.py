"""``sparkdp report RUN_DIR [RUN_DIR ...] --out DIR``: plots and a summary table of runs."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="plot and tabulate finished runs from their run logs",
        description="Draw loss, accuracy, throughput, staleness, bytes per sample and system "
        "usage of one or more runs (the --out directories of `sparkdp train`) on "
        "shared axes, and write a Markdown summary table.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="a run's directory (holding run.jsonl)")
    p.add_argument("--out", required=True, help="directory for the PNGs and summary.md")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..monitor.report import load_run, write_report

    runs = [load_run(d) for d in args.runs]
    for path in write_report(runs, args.out):
        print(path)
    return 0
