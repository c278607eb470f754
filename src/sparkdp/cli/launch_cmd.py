"""``sparkdp launch SCRIPT.py [options] -- [script args]``: an unmodified script as every worker."""

from __future__ import annotations

import argparse
import os

from ..config import GROUPS, RUN_SETTINGS, JobConfig, group_of
from ..errors import ConfigError
from .fields import add_job_settings, job_settings


def settings_classes() -> tuple[tuple[type, list[str]], ...]:
    """The settings classes ``sparkdp launch`` takes, limited to what ``sparkdp.run`` uses."""
    return tuple(
        (GROUPS[group], [name for name in RUN_SETTINGS if group_of(name) == group])
        for group in dict.fromkeys(group_of(name) for name in RUN_SETTINGS)
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run an unmodified training script on every Spark worker",
        description="Run SCRIPT.py as every worker of a job, with its own arguments (after --). "
        "A torchrun-style script runs unchanged (synchronous strategies); a "
        "single-machine one needs the one line sparkdp.distribute(model, optimizer, "
        "loader), and then also trains asynchronously (--strategy hogwild, asgd...). "
        "With --quiet the workers' output stays in the executors' logs.",
    )
    add_job_settings(p, settings_classes(), run)
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's own arguments")


def run(args) -> int:
    import sparkdp

    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    settings = job_settings(args)
    job = JobConfig.of(settings, allowed=RUN_SETTINGS, caller="sparkdp launch")
    if not os.path.isfile(args.script):  # refused before Spark starts (several seconds), as launch() would
        raise ConfigError(
            f"no training script at {os.path.abspath(args.script)!r}; give the path of a .py file."
        )
    spark = sparkdp.session(
        job.scaling.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN"
    )
    sparkdp.launch(args.script, *script_args, spark=spark, **settings)
    return 0
