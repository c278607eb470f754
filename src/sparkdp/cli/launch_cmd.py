"""``sparkdp launch SCRIPT.py [options] -- [script args]``: an unmodified script as every worker."""

from __future__ import annotations

import argparse

from ..config import JOB_DEFAULTS
from .train_cmd import key_value


def add_parser(sub) -> None:
    from ..strategies import STRATEGIES

    p = sub.add_parser("launch", help="run an unmodified training script on every Spark worker",
                       description="Run SCRIPT.py as every worker of a job, with its own arguments (after --). "
                                   "A torchrun-style script runs unchanged (synchronous strategies); a "
                                   "single-machine one needs the one line sparkdp.distribute(model, optimizer, "
                                   "loader), and then also trains asynchronously (--strategy hogwild, asgd...).")
    p.add_argument("--workers", type=int, help="Spark tasks to run (default: all task slots)")
    p.add_argument("--strategy", default=JOB_DEFAULTS.strategy, help=f"one of {', '.join(STRATEGIES.available())}")
    p.add_argument("--strategy-option", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="strategy setting, e.g. push_every=4 or period=4 (repeatable)")
    p.add_argument("--master", help="Spark master URL (default: embedded local[N])")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: spark.task.cpus)")
    p.add_argument("--seed", type=int, default=JOB_DEFAULTS.seed, help="seed of the data shuffles (distribute)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not forward the workers' output to this console (it stays in the executors' logs)")
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's own arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    import sparkdp

    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    spark = sparkdp.session(args.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN")
    sparkdp.launch(args.script, *script_args, workers=args.workers, strategy=args.strategy,
                   strategy_options=dict(args.strategy_option), seed=args.seed,
                   spark=spark, threads=args.threads, show_progress=not args.quiet)
    return 0
