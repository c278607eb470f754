"""The per-worker context that ``run`` sets up and ``distribute`` reads.

Outside a sparkdp job the context is a single process (world size 1), so a
script that calls ``sparkdp.distribute`` still runs unchanged on one machine.
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass, field

import torch

from ..comm.base import Collective
from ..comm.single import SingleProcessCollective
from ..monitor.probe import WorkerProbe
from ..strategies.base import Strategy
from .role import WorkerRole, role_of


@dataclass
class WorkerContext:
    rank: int
    world_size: int
    collective: Collective
    strategy: Strategy
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    active: list[Strategy] = field(default_factory=list)
    #: the worker's live-monitoring probe (``sparkdp.monitor``); None: not monitored
    probe: WorkerProbe | None = None
    #: which process the worker started this is (``train.children``); None: the worker itself
    child: int | None = None
    #: the process the context belongs to: a forked child inherits its parent's, and must not use it
    pid: int = field(default_factory=os.getpid)
    #: which attempt of the job this is (0: the first; n: the n-th restart, torchrun's
    #: TORCHELASTIC_RESTART_COUNT) and the job's checkpoint directory, if it has one
    restart: int = 0
    checkpoint_dir: str | None = None

    @property
    def role(self) -> WorkerRole:
        """What kind of worker this is (a sync member, an async worker, a spawned child)."""
        return role_of(self.collective, self.child)

    def new_strategy(self) -> Strategy:
        """A fresh copy of the job's strategy (one per distributed model)."""
        strategy = copy.deepcopy(self.strategy)
        self.active.append(strategy)
        return strategy

    def finish(self) -> None:
        for strategy in self.active:
            strategy.finish()
        self.active.clear()


_local = threading.local()


def current() -> WorkerContext:
    """This worker's context: the one its task set, the job's child context in a process a
    worker started (``train.children``), or a single process outside any job."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None or ctx.pid != os.getpid():
        from .children import ENV, child_parts, finish_at_exit, read_child_spec

        if os.environ.get(ENV):  # taken out: the child's own processes (data loaders...) are not children
            ctx = WorkerContext(**child_parts(read_child_spec(os.environ.pop(ENV))))
            finish_at_exit(ctx)
        else:
            from ..strategies.allreduce import AllReduce

            ctx = WorkerContext(0, 1, SingleProcessCollective(), AllReduce())
        _local.ctx = ctx
    return ctx


def set_current(ctx: WorkerContext | None) -> None:
    _local.ctx = ctx
