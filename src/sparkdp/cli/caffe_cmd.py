"""``sparkdp caffe inspect|convert NET.prototxt``: show what a Caffe net converts to, convert weights."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from ..config import setting
from ..errors import SparkdpError

_SHAPE_HELP = (
    "shape of an input blob: NAME=N,C,H,W names a top of a data/input layer (e.g. data=10,4); "
    "a bare N,C,H,W is the first input's. Repeatable, once per input; needed for "
    "Data/HDF5Data layers, optional for Input (overrides)"
)


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


def input_shape_arg(text: str) -> tuple[str | None, tuple[int, ...]]:
    """``NAME=N,C,H,W`` → ``(NAME, dims)``; a bare ``N,C,H,W`` → ``(None, dims)`` (the first input)."""
    if "=" not in text:
        return None, _shape(text)
    name, _, dims = text.partition("=")
    name = name.strip()
    if not name:
        raise argparse.ArgumentTypeError(
            "expected NAME=N,C,H,W with the input blob's name before '=' (e.g. data=64,1,28,28); "
            f"got {text!r}"
        )
    if not dims.strip():
        raise argparse.ArgumentTypeError(
            f"expected NAME=N,C,H,W with the shape after '=' (e.g. {name}=64,1,28,28); got {text!r}"
        )
    try:
        return name, _shape(dims)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"in {text!r}: {err}") from None


class InputShapes(argparse.Action):
    """Collects repeated ``--input-shape`` values into ``{name or None: dims}``; each input once."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        name, dims = values
        shapes = dict(getattr(namespace, self.dest) or {})
        if name in shapes:
            what = "the bare N,C,H,W form (the first input's shape)" if name is None else f"{name}=..."
            raise argparse.ArgumentError(self, f"{what} is given more than once")
        shapes[name] = dims
        setattr(namespace, self.dest, shapes)


@dataclass(frozen=True)
class CaffeOptions:
    """Caffe model: train a Caffe net with its own solver (instead of --model or a script); without --dataset/--data, from the sources its Data/HDF5Data layers name.

    Attributes:
        caffe_net: the train/test net prototxt; takes precedence over the solver's net: path.
        caffe_solver: the solver prototxt: sets optimizer, lr_policy, weight decay; max_iter sets the epochs unless epochs is given; the Data layer's batch_size is the per-worker batch unless batch_size is given.
        caffe_input_shape: the shape of a fed top the data does not tell, NAME=N,C,H,W (repeatable), e.g. an HDF5Data layer's second dataset.
        caffe_weights: initial weights W.caffemodel (with run_dir, the trained ones go to RUN_DIR/model.caffemodel).
    """

    caffe_net: str | None = setting(None, metavar="NET.prototxt")
    caffe_solver: str | None = setting(None, metavar="SOLVER.prototxt")
    caffe_input_shape: Any = setting(None, metavar="NAME=N,C,H,W", parse=input_shape_arg, action=InputShapes)
    caffe_weights: str | None = setting(None, metavar="W.caffemodel")


def _add_net_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("net", metavar="NET.prototxt", help="the net definition")
    parser.add_argument(
        "--phase",
        choices=("TRAIN", "TEST"),
        default="TEST",
        type=str.upper,
        help="which phase's layers to build (default: TEST)",
    )
    parser.add_argument(
        "--input-shape",
        dest="input_shapes",
        type=input_shape_arg,
        action=InputShapes,
        metavar="[NAME=]N,C,H,W",
        help=_SHAPE_HELP,
    )
    parser.add_argument("--stage", action="append", default=[], help="a NetState stage (repeatable)")


def _split_shapes(args: argparse.Namespace) -> dict:
    """``inspect_net``/``convert_*`` keyword arguments from the collected ``--input-shape`` values."""
    shapes = dict(args.input_shapes or {})
    first = shapes.pop(None, None)
    return {"input_shape": first, "input_shapes": shapes or None}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``caffe`` (with ``inspect`` and ``convert``) to the main parser's subcommands."""
    caffe = subparsers.add_parser(
        "caffe",
        help="work with Caffe prototxt nets",
        description="Work with Caffe net definitions (.prototxt) and weights (.caffemodel).",
    )
    sub = caffe.add_subparsers(dest="caffe_command", metavar="COMMAND", required=True)
    inspect = sub.add_parser(
        "inspect",
        help="show layers, output shapes and parameter counts of a net",
        description="Convert a Caffe net and run it once on zeros.",
        epilog="example (an HDF5Data layer with tops data and label):\n"
        "  sparkdp caffe inspect train_val.prototxt --phase TRAIN \\\n"
        "      --input-shape data=10,4 --input-shape label=10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_net_arguments(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(func=run_inspect)

    convert = sub.add_parser(
        "convert",
        help="convert .caffemodel weights to a PyTorch state dict (.safetensors) and back",
        description="Build the net, load --weights (a .caffemodel) into it and write its state_dict() as\n"
        "safetensors (--out); it loads into sparkdp.caffe.load_net(NET.prototxt, phase=...).\n"
        "Or load a safetensors state dict (--weights) into the net and write its blobs as a\n"
        ".caffemodel (--to-caffemodel).",
        epilog="examples:\n"
        "  sparkdp caffe convert lenet.prototxt --weights lenet.caffemodel --out lenet.safetensors\n"
        "  sparkdp caffe convert lenet.prototxt --weights tuned.safetensors --to-caffemodel tuned.caffemodel",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_net_arguments(convert)
    convert.add_argument(
        "--weights",
        metavar="FILE",
        help="with --out: a .caffemodel to load (default: the prototxt's filler initialisation); "
        "with --to-caffemodel: the .safetensors state dict to write (required)",
    )
    target = convert.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", metavar="MODEL.safetensors", help="write the state dict as safetensors")
    target.add_argument(
        "--to-caffemodel", metavar="OUT.caffemodel", help="write the net's blobs as a .caffemodel"
    )
    convert.set_defaults(func=run_convert, convert_parser=convert)


def run_inspect(args: argparse.Namespace) -> int:
    """Handler of ``sparkdp caffe inspect``; returns the exit code."""
    from ..caffe.inspect import inspect_net  # torch is imported only when the command runs

    try:
        report = inspect_net(args.net, phase=args.phase, stages=args.stage, **_split_shapes(args))
    except SparkdpError as err:
        print(f"sparkdp caffe inspect: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_table(report)
    return 0


def run_convert(args: argparse.Namespace) -> int:
    """Handler of ``sparkdp caffe convert``; returns the exit code."""
    if args.to_caffemodel and not args.weights:
        args.convert_parser.error(
            "--to-caffemodel needs --weights MODEL.safetensors (the state dict to write as a .caffemodel)"
        )
    from ..caffe.convert import convert_to_caffemodel, convert_to_safetensors

    common = {"phase": args.phase, "stages": args.stage, **_split_shapes(args)}
    try:
        if args.out:
            result = convert_to_safetensors(args.net, args.out, weights=args.weights, **common)
        else:
            result = convert_to_caffemodel(args.net, args.weights, args.to_caffemodel, **common)
    except SparkdpError as err:
        print(f"sparkdp caffe convert: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # writing failed (permissions, disk full): the old output file is untouched
        print(
            f"sparkdp caffe convert: error: cannot write {args.out or args.to_caffemodel}: {err}",
            file=sys.stderr,
        )
        return 2
    net = f"net {result.net_name or args.net!r} ({args.phase})"
    if args.out:
        source = (
            f"weights from {args.weights} ({len(result.loaded)} layers)"
            if args.weights
            else "weights from the prototxt's fillers (no --weights given)"
        )
        print(f"wrote {result.path}: {result.tensors} tensors, {result.values:,} values of {net}; {source}")
        if result.ignored:
            print(f"ignored .caffemodel layers the net does not have: {', '.join(result.ignored)}")
        print(f"load it with: {result.metadata['sparkdp.load']}")
    else:
        print(
            f"wrote {result.path}: {len(result.loaded)} layers with {result.tensors} blobs, "
            f"{result.values:,} values of {net}, from {args.weights}"
        )
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
