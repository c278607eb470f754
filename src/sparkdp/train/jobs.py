"""Glue between a Spark barrier task and the training code: threads, device, process group."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from ..comm.base import Collective
from ..comm.torch_dist import TorchCollective

log = logging.getLogger(__name__)


def in_task(body: Callable[[Collective], Any], *, threads: int | None, pg_timeout_s: float) -> Callable:
    """Wrap ``body(collective)`` as the function the launcher runs on every task."""

    def task(info) -> Any:
        torch.set_num_threads(threads or max(1, info.cpus))
        if info.gpus:
            device = torch.device("cuda", int(info.gpus[0]))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        collective = TorchCollective(device=device).setup(
            master_addr=info.master_addr, master_port=info.master_port, rank=info.rank,
            world_size=info.world_size, timeout_s=pg_timeout_s, store=info.store)
        try:
            return body(collective)
        finally:
            collective.teardown()

    return task


def progress(enabled: bool, message: str):
    """A spinner on the driver's terminal while a job runs (nothing when not a terminal)."""
    if not enabled or not sys.stderr.isatty():
        return nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)
