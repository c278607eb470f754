"""Which kind of worker a process is, and what that kind decides.

A worker is one of three kinds:

- a **sync member**: one rank of a process group (``allreduce``, ``average``, ``fsdp``...). Its
  collectives reach the other ranks, so the ranks agree on checkpoints, preemptions and stop
  requests, a collective that times out means another rank stalled, and rank 0 speaks for all.
- an **async worker**: one task of a parameter-server job. It shares nothing with the other
  workers but the server (its collective never communicates), so it reports for itself, and the
  model and its checkpoints are the server's.
- a **spawned child**: a process an async worker's script started, which joined the job as a
  server worker of its own (``train.children``).

This is the one module of ``train/`` that reads whether a worker trains synchronously
(``Collective.independent``); everything else asks the role what it does.
"""

from __future__ import annotations

from typing import ClassVar

from ..comm.base import Collective


class WorkerRole:
    """What a worker does because of its kind (the class attributes) and its rank."""

    #: the kind's name in messages
    kind: ClassVar[str]
    #: its collectives reach the other ranks, so they agree on when to save, to stop for a
    #: preemption and to stop for the driver, and gather figures over the group
    agrees_with_peers: ClassVar[bool]
    #: it writes the job's training checkpoints (an asynchronous job's state is its server's)
    saves_checkpoints: ClassVar[bool]
    #: a collective of it that timed out means another rank stalled (a worker alone waits on nobody)
    names_stalled_peers: ClassVar[bool]
    #: it sends back its share of the trained model (an asynchronous job's model is the server's centre)
    returns_model: ClassVar[bool]
    #: its pushes to the server say how many rows they stand for (the server's figures)
    pushes_count_rows: ClassVar[bool]
    #: a script may set up torch.distributed over its process group (there is none otherwise)
    has_process_group: ClassVar[bool]
    #: processes its script starts can join the job, as server workers of their own
    children_join: ClassVar[bool]

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @property
    def leads(self) -> bool:
        """It speaks for its group: reports the history and looks for the driver's stop request
        (rank 0 of a process group; every worker that is a group of its own)."""
        return self.rank == 0 or not self.agrees_with_peers

    @property
    def is_main_process(self) -> bool:
        """It is where a script saves files and prints summaries: rank 0, not a process it started."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


class SyncMember(WorkerRole):
    """One rank of a process group."""

    kind = "sync member"
    agrees_with_peers = True
    saves_checkpoints = True
    names_stalled_peers = True
    returns_model = True
    pushes_count_rows = False
    has_process_group = True
    children_join = False


class AsyncWorker(WorkerRole):
    """One task of a parameter-server job."""

    kind = "async worker"
    agrees_with_peers = False
    saves_checkpoints = False
    names_stalled_peers = False
    returns_model = False
    pushes_count_rows = True
    has_process_group = False
    children_join = True


class SpawnedChild(AsyncWorker):
    """Process ``child`` started by async worker ``rank``, a server worker of its own."""

    kind = "spawned child"

    def __init__(self, rank: int, world_size: int, child: int) -> None:
        super().__init__(rank, world_size)
        self.child = child

    @property
    def is_main_process(self) -> bool:
        return False


def role_of(collective: Collective, child: int | None = None) -> WorkerRole:
    """The role of the worker that trains over ``collective`` (``child``: which process its
    Spark worker started this one as, ``train.children``; None: the Spark worker itself)."""
    rank, world = collective.rank, collective.world_size
    if not collective.independent:
        return SyncMember(rank, world)
    return AsyncWorker(rank, world) if child is None else SpawnedChild(rank, world, child)


__all__ = ["AsyncWorker", "SpawnedChild", "SyncMember", "WorkerRole", "role_of"]
