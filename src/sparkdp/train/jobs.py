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
from ..errors import EnvironmentProblem

log = logging.getLogger(__name__)


def in_task(
    body: Callable[[Collective], Any],
    *,
    threads: int | None,
    pg_timeout_s: float,
    restarts: tuple[int, int] = (0, 0),
) -> Callable:
    """Wrap ``body(collective)`` as the function the launcher runs on every task, in the torchrun
    environment of the task's place (``sparkdp.comm.torchrun_env``). ``restarts``: the job
    controller's restart number of this attempt and the job's ``max_restarts``, what every worker
    (``fit``'s, a ``run`` function, a launched script) reads as TORCHELASTIC_RESTART_COUNT and
    TORCHELASTIC_MAX_RESTARTS."""
    restart_count, max_restarts = restarts

    def task(info) -> Any:
        torch.set_num_threads(threads or max(1, info.cpus))
        device = task_device(info.gpus)
        placement = getattr(info, "placement", None)
        if placement is not None and device.type == "cuda" and device.index != placement.local_rank:
            log.warning(
                "rank %d computes on %s, but its LOCAL_RANK is %d: a script that picks cuda:LOCAL_RANK "
                "uses another GPU. Give each host's tasks the GPUs 0..n-1 (one per task), or narrow each "
                "executor's CUDA_VISIBLE_DEVICES to its own GPUs.",
                info.rank,
                device,
                placement.local_rank,
            )
        collective = TorchCollective(device=device).setup(
            master_addr=info.master_addr,
            master_port=info.master_port,
            rank=info.rank,
            world_size=info.world_size,
            timeout_s=pg_timeout_s,
            store=info.store,
            store_listening=True,
            placement=placement,
            run_id=getattr(info, "run_id", "none"),
            restart_count=restart_count,
            max_restarts=max_restarts,
        )
        try:
            return body(collective)
        finally:
            collective.teardown()

    return task


def task_device(gpus: tuple[str, ...]) -> torch.device:
    """The device a worker computes on: the first GPU Spark assigned to its task
    (``spark.task.resource.gpu.amount``), made current; the CPU when Spark assigned none."""
    if not gpus:
        return torch.device("cpu")
    if len(gpus) > 1:
        log.warning(
            "Spark assigned GPUs %s to one task; a sparkdp worker uses one (%s). Set "
            "spark.task.resource.gpu.amount=1 and run one worker per GPU.",
            list(gpus),
            gpus[0],
        )
    try:
        index = int(gpus[0])
    except ValueError:
        raise EnvironmentProblem(
            f"Spark assigned the GPU address {gpus[0]!r} to this task; sparkdp needs CUDA "
            "device ordinals (0, 1, ...). Check the GPU discovery script "
            "(spark.executor.resource.gpu.discoveryScript)."
        ) from None
    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            f"Spark assigned GPU {index} to this task (spark.task.resource.gpu.amount), but torch "
            f"{torch.__version__} on this executor cannot use CUDA (a CPU-only build, or no driver). Install a "
            "CUDA build of torch in the executors' Python, or drop the GPU resource settings to train on CPUs."
        )
    if index >= torch.cuda.device_count():
        raise EnvironmentProblem(
            f"Spark assigned GPU {index} to this task, but torch sees {torch.cuda.device_count()} "
            "GPU(s) on this executor; check CUDA_VISIBLE_DEVICES and the discovery script."
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def progress(enabled: bool, message: str):
    """A spinner on the driver's terminal while a job runs (nothing when not a terminal)."""
    if not enabled or not sys.stderr.isatty():
        return nullcontext()
    from rich.console import Console

    return Console(stderr=True).status(message)
