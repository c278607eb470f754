"""What a running sparkdp task learns about itself and its stage: its rank, the group's
rendezvous (rank 0's TCPStore), its address, its resources and attempt; and the barrier
stage's own channel (``allGather``, ``barrier``). Called inside Spark tasks only.

Rendezvous follows TorchDistributor: rank 0's address comes from the barrier context's task
infos, and the port of the TCPStore rank 0 opens is shared with ``allGather`` (barrier-scoped,
so a retried stage attempt never meets the failed attempt's store). Rank 0 binds the store's
socket to its own task address itself: a TCPStore left to bind alone listens on every interface.
The same ``allGather`` carries every task's host and GPU, from which each task learns its place
among the ranks as torchrun describes it (``LOCAL_RANK``...: :mod:`sparkdp.comm.torchrun_env`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from ..comm.torchrun_env import Place, Placement, placements
from .board import BoardLink


@dataclass(frozen=True)
class TaskInfo:
    """What a worker learns about itself from the barrier context."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    gpus: tuple[str, ...]
    cpus: int
    #: On rank 0, the torch.distributed TCPStore it already listens on (see rendezvous).
    store: Any = field(default=None, compare=False, repr=False)
    #: Its place among the stage's ranks (hosts, local ranks); None: every rank on one host.
    placement: Placement | None = None
    #: The barrier stage's identity (torchrun's TORCHELASTIC_RUN_ID) and the task's attempt (0: the first).
    run_id: str = "none"
    attempt: int = 0
    #: Seconds this task waited in the exchange with the other tasks (all of them arriving included).
    rendezvous_s: float = 0.0


def listening_store(host: str, world_size: int):
    """A master ``TCPStore`` listening on ``host`` only, on a port the OS chooses.

    The socket is bound here and handed to the store (which then owns and closes it):
    a TCPStore that binds by itself listens on every interface of the machine.
    """
    from torch.distributed import TCPStore

    family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(address)
        sock.listen(128)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return TCPStore(
            host,
            port,
            world_size,
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=fd,
            use_libuv=True,
        )
    except BaseException:
        os.close(fd)
        raise


def rendezvous(with_store: bool = True, board: BoardLink | None = None) -> TaskInfo:
    """This task's rank and the group's master address; with ``with_store``, rank 0 opens the
    torch.distributed TCPStore and every task learns its port. The tasks exchange what they know
    through the driver's ``board`` when the stage has one (:mod:`sparkdp.spark.board`: in
    milliseconds), else through the barrier's ``allGather`` (about a second)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    infos = ctx.getTaskInfos()
    rank = ctx.partitionId()
    master_addr = infos[0].address.rsplit(":", 1)[0]
    # Rank 0 binds port 0 and shares the port the OS chose: no window in which another
    # process can take a "free" port between choosing and binding it.
    store = listening_store(master_addr, len(infos)) if rank == 0 and with_store else None
    gpus, cpus = task_resources()
    own = {
        "port": store.port if store is not None else 0,
        "host": infos[rank].address.rsplit(":", 1)[0].strip("[]"),
        "gpu": gpus[0] if gpus else None,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }
    exchange_started = time.monotonic()
    if board is not None:
        gathered = board.gather(rank, f"{ctx.stageId()}.{ctx.attemptNumber()}", own)
    else:
        gathered = [json.loads(message) for message in ctx.allGather(json.dumps(own))]
    placement = placements([Place(g["host"], _ordinal(g["gpu"]), g["visible"]) for g in gathered])[rank]
    return TaskInfo(
        rank,
        len(infos),
        master_addr,
        int(gathered[0]["port"]),
        gpus,
        cpus,
        store,
        placement,
        run_id=f"spark-stage-{ctx.stageId()}",
        attempt=ctx.attemptNumber(),
        rendezvous_s=time.monotonic() - exchange_started,
    )


def _ordinal(gpu: str | None) -> int | None:
    """A GPU address as the CUDA ordinal the task computes on (``train.jobs.task_device``
    refuses addresses that are not ordinals)."""
    try:
        return int(gpu) if gpu is not None else None
    except ValueError:
        return None


def task_host() -> str:
    """The address Spark reaches this barrier task's executor on: where a server the task
    starts listens (never every interface)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    return ctx.getTaskInfos()[ctx.partitionId()].address.rsplit(":", 1)[0].strip("[]")


def all_gather(message: str) -> list[str]:
    """Every task's ``message`` of this barrier stage, by rank: Spark's own channel, so tasks
    learn each other's addresses without any connection to the driver."""
    from pyspark import BarrierTaskContext

    return list(BarrierTaskContext.get().allGather(message))


def stage_barrier() -> None:
    """Wait until every task of this barrier stage has reached this point."""
    from pyspark import BarrierTaskContext

    BarrierTaskContext.get().barrier()


def task_resources() -> tuple[tuple[str, ...], int]:
    """The GPU addresses Spark assigned to the running task (``spark.task.resource.gpu.amount``)
    and its cores (``spark.task.cpus``); no GPUs and one core outside a Spark task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return (), 1
    resources = ctx.resources()
    gpus = tuple(resources["gpu"].addresses) if "gpu" in resources else ()
    return gpus, max(1, int(ctx.cpus()))


def task_attempt() -> int:
    """Which attempt of its Spark task is running (0: the first; 0 outside Spark)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0
