"""``sparkdp report RUN_DIR [RUN_DIR ...] --out DIR``: plots and a summary table of runs."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="plot and tabulate finished runs from their run logs",
        description="Draw loss, accuracy, throughput, staleness, bytes per sample and system "
        "usage of one or more runs (the --out directories of `sparkdp train`) on "
        "shared axes, and write a Markdown summary table. Given a `sparkdp tune --json-out` "
        "file instead, draw Optuna's optimisation history and parameter importances.",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run's directory (holding run.jsonl), or a sparkdp tune --json-out file",
    )
    p.add_argument("--out", required=True, help="directory for the PNGs and summary.md")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..monitor.report import load_run, write_report
    from ..tuning.plots import is_search_summary, write_search_report

    searches = [d for d in args.runs if is_search_summary(d)]
    for summary in searches:  # one search's plots (several: each into a folder of its own)
        out = args.out if len(searches) == 1 else str(Path(args.out) / Path(summary).stem)
        for path in write_search_report(summary, out):
            print(path)
    runs = [load_run(d) for d in args.runs if d not in searches]
    if runs:
        for path in write_report(runs, args.out):
            print(path)
    return 0
