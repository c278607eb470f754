"""The environment ``torchrun`` gives each process, computed from where the job's ranks run.

Scripts written for ``torchrun`` (and Hugging Face ``Trainer`` / ``accelerate``, which read the
same variables) learn their place from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``... A *group* is what torchrun calls a node: the ranks of
one host. ``LOCAL_RANK`` is a rank's index within its group, ordered by global rank, or by GPU
where every rank of the group has one, so that ``cuda:LOCAL_RANK`` is the GPU the task was given
(``sparkdp.train.jobs.task_device``). Ranks whose processes see different
``CUDA_VISIBLE_DEVICES`` (an executor narrowed to its own GPUs, as TorchDistributor and YARN
do) cannot index each other's GPUs, so each such set forms a group of its own: a task narrowed
to one GPU has ``LOCAL_RANK`` 0 and computes on ``cuda:0``.

Plain arithmetic on the ranks' places: :mod:`sparkdp.spark.task` gathers the places, and
:func:`sparkdp.comm.torch_dist.set_torch_distributed_env` sets the variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: torchrun's role name when none is given (``--role``)
ROLE_NAME = "default"


@dataclass(frozen=True)
class Place:
    """Where one rank runs: its host, the GPU ordinal its task computes on (None: the CPU), and
    its process's ``CUDA_VISIBLE_DEVICES`` ("" when unset)."""

    host: str
    gpu: int | None = None
    visible: str = ""

    def group_key(self) -> tuple[str, str]:
        # CPU ranks of one host share it whatever their GPU visibility
        return self.host, self.visible if self.gpu is not None else ""


@dataclass(frozen=True)
class Placement:
    """One rank's place among the job's ranks, in torchrun's terms."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int

    @classmethod
    def one_host(cls, rank: int, world_size: int) -> Placement:
        """Every rank on this host (processes a test or a single machine starts)."""
        return cls(rank, world_size, rank, world_size, 0, 1)


def placements(places: Sequence[Place]) -> list[Placement]:
    """Every rank's :class:`Placement`, by rank, from every rank's :class:`Place`.

    Groups are numbered in the order of their lowest rank. Within a group, ranks are ordered by
    their GPU ordinal when all of them have one (so ``LOCAL_RANK`` equals the ordinal when the
    group's GPUs are 0..n-1), else by rank."""
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, place in enumerate(places):
        groups.setdefault(place.group_key(), []).append(rank)
    out: list[Placement | None] = [None] * len(places)
    for group_rank, ranks in enumerate(groups.values()):
        gpus = [places[r].gpu for r in ranks]
        if all(g is not None for g in gpus):
            ranks = sorted(ranks, key=lambda r: (places[r].gpu, r))
        for local_rank, rank in enumerate(ranks):
            out[rank] = Placement(rank, len(places), local_rank, len(ranks), group_rank, len(groups))
    return [p for p in out if p is not None]


def torchrun_env(
    placement: Placement,
    master_addr: str,
    master_port: int,
    *,
    run_id: str = "none",
    restart_count: int = 0,
    max_restarts: int = 0,
) -> dict[str, str]:
    """The variables torchrun sets for a worker process (its ``torch.distributed.run`` documentation
    lists them), for the rank at ``placement``.

    ``restart_count``: how many times the workers were restarted before this attempt (0 on the
    first); ``max_restarts``: how many restarts the job allows."""
    p = placement
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(p.rank),
        "WORLD_SIZE": str(p.world_size),
        "LOCAL_RANK": str(p.local_rank),
        "LOCAL_WORLD_SIZE": str(p.local_world_size),
        "GROUP_RANK": str(p.group_rank),
        "GROUP_WORLD_SIZE": str(p.group_world_size),
        # one role: every worker runs the same script
        "ROLE_NAME": ROLE_NAME,
        "ROLE_RANK": str(p.rank),
        "ROLE_WORLD_SIZE": str(p.world_size),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
    }


def placement_from_env(environ: Mapping[str, str]) -> Placement | None:
    """The :class:`Placement` that :func:`torchrun_env` wrote into ``environ`` (or torchrun itself
    did); None when any of its variables is missing or not a number."""
    try:
        return Placement(
            *(
                int(environ[name])
                for name in (
                    "RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "LOCAL_WORLD_SIZE",
                    "GROUP_RANK",
                    "GROUP_WORLD_SIZE",
                )
            )
        )
    except (KeyError, ValueError):
        return None


#: every variable :func:`torchrun_env` sets
TORCHRUN_VARIABLES = tuple(torchrun_env(Placement.one_host(0, 1), "", 0))

__all__ = [
    "ROLE_NAME",
    "TORCHRUN_VARIABLES",
    "Place",
    "Placement",
    "placement_from_env",
    "placements",
    "torchrun_env",
]
