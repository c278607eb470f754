"""``sparkdp launch SCRIPT.py [options] -- [script args]``: an unmodified script as every worker."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import GROUPS, RUN_SETTINGS, JobConfig, group_of, setting
from ..errors import ConfigError
from .fields import add_job_settings, job_settings


@dataclass(frozen=True)
class LaunchOutputs:
    """What sparkdp launch writes besides the run log.

    Attributes:
        json_out: write a JSON summary of the run to this file: the script, strategy, workers, wall time and the parameter server's totals (pushes, staleness, bytes) for an asynchronous strategy.
    """

    json_out: str | None = setting(None, metavar="FILE")


def settings_classes() -> tuple[tuple[type, Any], ...]:
    """The settings classes ``sparkdp launch`` takes, limited to what ``sparkdp.run`` uses."""
    return (
        *(
            (GROUPS[group], [name for name in RUN_SETTINGS if group_of(name) == group])
            for group in dict.fromkeys(group_of(name) for name in RUN_SETTINGS)
        ),
        (LaunchOutputs, None),
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
    if job.monitor.run_dir:  # (refused before Spark starts, as sparkdp train does)
        from ..monitor.sinks import writable_dir

        writable_dir(job.monitor.run_dir, "run log")
    spark = sparkdp.session(
        job.scaling.master, log_level="OFF" if not getattr(args, "verbose", 0) else "WARN"
    )
    summary = sparkdp.launch(args.script, *script_args, spark=spark, **settings)
    if args.json_out:
        from ..files import atomic_write

        atomic_write(args.json_out, lambda tmp: Path(tmp).write_text(json.dumps(summary, indent=2)))
    return 0
