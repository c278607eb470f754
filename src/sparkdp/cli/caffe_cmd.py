"""``sparkdp caffe inspect NET.prototxt``: show what a Caffe net converts to."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import SparkdpError


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers such as 64,1,28,28; got {text!r}"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"expected positive dims such as 64,1,28,28; got {text!r}")
    return dims


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``caffe`` (with its ``inspect`` subcommand) to the main parser's subcommands."""
    caffe = subparsers.add_parser(
        "caffe",
        help="work with Caffe prototxt nets",
        description="Work with Caffe net definitions (.prototxt).",
    )
    sub = caffe.add_subparsers(dest="caffe_command", metavar="COMMAND", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="show layers, output shapes and parameter counts of a net",
        description="Convert a Caffe net and run it once on zeros.",
    )
    inspect.add_argument("net", metavar="NET.prototxt", help="the net definition")
    inspect.add_argument(
        "--phase",
        choices=("TRAIN", "TEST"),
        default="TEST",
        type=str.upper,
        help="which phase's layers to build (default: TEST)",
    )
    inspect.add_argument(
        "--input-shape",
        type=_shape,
        metavar="N,C,H,W",
        help="shape of the first input blob; needed for Data layers",
    )
    inspect.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    """Handler of ``sparkdp caffe inspect``; returns the exit code."""
    from ..caffe.inspect import inspect_net  # torch is imported only when the command runs

    try:
        report = inspect_net(args.net, phase=args.phase, input_shape=args.input_shape, stages=args.stage)
    except SparkdpError as err:
        print(f"sparkdp caffe inspect: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_table(report)
    return 0


def _print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{report['name'] or 'net'} ({report['phase']})")
    for column in ("layer", "type", "bottoms", "tops", "top shapes", "params"):
        table.add_column(column, justify="right" if column == "params" else "left")
    for row in report["layers"]:
        shapes = "  ".join("x".join(map(str, s)) or "scalar" for s in row["top_shapes"])
        table.add_row(
            row["name"],
            row["type"],
            ", ".join(row["bottoms"]),
            ", ".join(row["tops"]),
            shapes,
            f"{row['params']:,}",
        )
    console = Console()
    console.print(table)
    outputs = ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in report["outputs"].items())
    console.print(f"outputs: {outputs}")
    console.print(
        f"learnable parameters: {report['learnable_params']:,}"
        + (f" (+{report['frozen_params']:,} frozen)" if report["frozen_params"] else "")
    )
