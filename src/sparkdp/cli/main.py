"""``sparkdp`` — entry point: subcommands register themselves with ``add_parser``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..errors import SparkdpError
from . import bench_cmd, caffe_cmd, env_cmd, export_cmd, launch_cmd, plan_cmd, report_cmd, train_cmd, tune_cmd


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkdp", description="Data-parallel PyTorch training on Apache Spark."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (
        train_cmd,
        launch_cmd,
        report_cmd,
        plan_cmd,
        bench_cmd,
        env_cmd,
        caffe_cmd,
        export_cmd,
        tune_cmd,
    ):
        command.add_parser(sub)
    return parser


def _session_running() -> bool:
    if "pyspark" not in sys.modules:
        return False
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is not None


def main(argv: Sequence[str] | None = None) -> int:
    caller_session = _session_running()  # a caller's session (a notebook, a test) is theirs to stop
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        if getattr(args, "config", None):  # a job file's values become the defaults; flags win
            from .fields import load_job_file

            args.parser.set_defaults(**load_job_file(args.config, args.settings))
            args = parser.parse_args(argv)
        if getattr(args, "print_config", False):
            from .fields import effective_config

            print(effective_config(args, args.settings), end="")
            return 0
        return int(args.func(args) or 0)
    except SparkdpError as exc:
        print(f"sparkdp: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparkdp: interrupted", file=sys.stderr)
        return 130
    finally:  # a command leaves no JVM behind, and nothing printed after it returns
        if "pyspark" in sys.modules and not caller_session:
            from ..spark.session import stop_quietly

            stop_quietly()


if __name__ == "__main__":
    sys.exit(main())
