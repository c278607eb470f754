"""Run an unmodified training script as one worker of a job (``sparkdp launch``).

The script runs as ``__main__`` with its own ``sys.argv``, its directory first on ``sys.path``
and the driver's working directory, inside a task whose process group is already up (the
environment ``torch.distributed`` reads is set: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...).
A ``torchrun``-style script's ``init_process_group()`` therefore finds the group ready and
is a no-op, and its ``destroy_process_group()`` is left to the task; a plain script with the
one ``sparkdp.distribute(...)`` line works as under ``sparkdp.run``. A script that never calls
``distribute`` (torchrun style, Hugging Face ``Trainer``, ``accelerate``) is watched from outside
(``sparkdp.train.observe``): its collectives, DDP modules and optimizer steps feed the live
monitor and decide whether its workers trained together. Every line the script
prints reaches the driver's console with a ``[rank R]`` prefix, through the job's monitoring
link (``sparkdp.monitor``: so also from a cluster's executors), or in the executor's own log,
prefixed, when the job is not monitored (``show_progress=False``).
"""

from __future__ import annotations

import io
import os
import runpy
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist

from ..errors import ConfigError
from ..monitor.probe import WorkerProbe
from .children import children_join
from .context import current
from .observe import ScriptObserver


class ScriptFailed(RuntimeError):
    """The script exited with a non-zero status on a worker."""


class _ToDriver(io.TextIOBase):
    """A text stream whose writes go to the driver's console through the monitoring probe
    (the hub adds the ``[rank R]`` prefix); the whole text, however long."""

    def __init__(self, probe: WorkerProbe, stream: str) -> None:
        self.probe, self.stream = probe, stream

    def write(self, text: str) -> int:
        self.probe.output(self.stream, text)
        return len(text)


class _RankPrefixed(io.TextIOBase):
    """A text stream that writes ``[rank R] `` before every line to the stream under it
    (where no monitoring link reaches the driver: output stays in the executor's log)."""

    def __init__(self, under: Any, rank: int) -> None:
        self.under, self.prefix, self.at_line_start = under, f"[rank {rank}] ", True

    def write(self, text: str) -> int:
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith("\n")
        self.under.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self.under.flush()


@contextmanager
def _ready_process_group():
    """``init_process_group`` / ``destroy_process_group`` as a script expects them, on the task's group."""
    init, destroy = dist.init_process_group, dist.destroy_process_group

    def init_once(*args: Any, **kwargs: Any) -> None:
        if not current().role.has_process_group:
            raise ConfigError(
                f"the script sets up torch.distributed itself (init_process_group), but the job's "
                f"strategy {current().strategy.name!r} is asynchronous: its workers share no process "
                "group. Launch it with --strategy allreduce or average, or use the one line "
                "sparkdp.distribute(model, optimizer, loader) instead of DDP."
            )
        if not dist.is_initialized():
            init(*args, **kwargs)

    def keep(*args: Any, **kwargs: Any) -> None:
        """The task destroys its group after the script."""

    dist.init_process_group, dist.destroy_process_group = init_once, keep
    try:
        yield
    finally:
        dist.init_process_group, dist.destroy_process_group = init, destroy


def run_script(
    path: str, args: list[str], cwd: str, shipped: Callable[[], str] | None = None
) -> dict[str, Any]:
    """Run the script on this worker; returns whether its workers trained together (``distributed``:
    it used ``sparkdp.distribute``, communicated over the process group, or processes it started
    joined the job) and what it started.

    ``shipped``: where this executor holds the copy of the script's directory the driver
    shipped (``sparkdp.spark.files``, on clusters): the worker runs that copy, in the driver's
    working directory where this machine has it, else in the copy's directory."""
    ctx = current()
    rank, probe = ctx.rank, ctx.probe
    if shipped is not None:
        path = os.path.join(shipped(), os.path.basename(path))
        cwd = cwd if os.path.isdir(cwd) else os.path.dirname(path)
    observer = ScriptObserver(probe if probe is not None and probe.active else None)
    if observer.probe is not None:  # until the script calls sparkdp.distribute, whose strategy counts
        observer.probe.comm_stats = observer.comm_stats
    saved_argv, saved_path, saved_cwd = list(sys.argv), list(sys.path), os.getcwd()
    saved_out, saved_err = sys.stdout, sys.stderr
    with _ready_process_group(), children_join(ctx) as children, observer.watching():
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        os.chdir(cwd)
        if probe is not None and probe.active:
            sys.stdout, sys.stderr = _ToDriver(probe, "stdout"), _ToDriver(probe, "stderr")
        else:
            sys.stdout, sys.stderr = _RankPrefixed(saved_out, rank), _RankPrefixed(saved_err, rank)
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise ScriptFailed(
                    f"{os.path.basename(path)} exited with status {exc.code!r} on worker {rank}"
                ) from None
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.argv, sys.stdout, sys.stderr = saved_argv, saved_out, saved_err
            sys.path[:] = saved_path
            os.chdir(saved_cwd)
    return {
        "distributed": bool(current().active) or observer.communicated or bool(children.joined),
        "workers": ctx.world_size,
        "started": children.started,
        "joined": len(children.joined),
        "joinable": children.joinable,
    }
