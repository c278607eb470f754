"""Hybrid sharded data parallelism: FSDP2 within each host, replicas across hosts.

``fully_shard`` over a two-dimensional device mesh (replicas × shard group) gives PyTorch's
HSDP: each block's parameters are all-gathered and its gradients reduce-scattered among the
workers of one host only, and the gradient shards are then all-reduced across the hosts, one
rank per host per shard. A slow link between hosts carries 1/S of the gradient once per step
(S: the workers of a host) instead of fsdp's parameter all-gathers, while each worker still
keeps 1/S of the model state. Everything else (shard units, precision, whole states for
results and checkpoints, evaluation) is :class:`~sparkdp.strategies.fsdp.FSDP`'s.

The host grouping is the one torchrun's ``GROUP_RANK`` / ``LOCAL_RANK`` describe
(:mod:`sparkdp.comm.torchrun_env`), which the synchronous launcher sets in every worker.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..comm.base import Collective
from ..comm.torchrun_env import Placement, placement_from_env
from ..config import check_int
from ..errors import ConfigError
from .base import ring_bytes
from .fsdp import FSDP, PARAM_DTYPES

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class HSDP(FSDP):
    """FSDP sharded within each host and replicated across hosts (FSDP2 on a 2-D mesh).

    Args:
        shard_size: the workers of one shard group; None: all the workers of a host (every
            host must run the same number). A number splits each host's workers into groups of
            that many (it must divide every host's count): ``shard_size=2`` on one machine with
            4 workers trains as 2 replicas of 2 shards, as two 2-worker hosts would.
        reshard_after_forward, min_params, param_dtype, reduce_dtype: as ``fsdp``'s.
    """

    name = "hsdp"

    def __init__(
        self,
        shard_size: int | None = None,
        reshard_after_forward: bool = True,
        min_params: int = 1_000_000,
        param_dtype: str | None = None,
        reduce_dtype: str = "fp32",
    ) -> None:
        super().__init__(reshard_after_forward, min_params, param_dtype, reduce_dtype)
        check_int("hsdp: shard_size", shard_size, optional=True)
        self.shard_size = shard_size
        self._mesh_shape: tuple[int, int] | None = None

    def device_mesh(self, collective: Collective) -> DeviceMesh:
        """The (replicas, shard group) mesh: each row the ranks of one shard group, by local rank."""
        from torch.distributed.device_mesh import DeviceMesh

        rank, world = collective.rank, collective.world_size
        mine = placement_from_env(os.environ)
        if mine is None or (mine.rank, mine.world_size) != (rank, world):
            mine = Placement.one_host(rank, world)  # a process group started without torchrun's variables
        places = collective.all_gather(torch.tensor([mine.group_rank, mine.local_rank], dtype=torch.int64))
        rows = shard_groups([(int(p[0]), int(p[1])) for p in places], self.shard_size)
        self._mesh_shape = (len(rows), len(rows[0]))
        return DeviceMesh(collective.device.type, torch.tensor(rows), mesh_dim_names=("replicate", "shard"))

    def wire_bytes(self, values: int, gathered: int, world_size: int, frozen: int = 0) -> int:
        """fsdp's gathers and reduce-scatter within a shard group, plus the all-reduce of each
        rank's gradient shard (1/S of the values) across the replicas."""
        replicas, shard = self._mesh_shape or (1, world_size)
        reduce = PARAM_DTYPES[self.reduce_dtype].itemsize
        return super().wire_bytes(values, gathered, shard, frozen) + ring_bytes(
            values * reduce // shard, replicas
        )

    def options(self) -> dict[str, Any]:
        return {
            **super().options(),
            "shard_size": self.shard_size,
            "mesh": list(self._mesh_shape) if self._mesh_shape else None,
        }


def shard_groups(places: Sequence[tuple[int, int]], shard_size: int | None) -> list[list[int]]:
    """The ranks of each shard group, one list per group: ``places[rank]`` is the rank's
    (host group, local rank). Each host's ranks, ordered by local rank, form one group
    (``shard_size`` None) or consecutive groups of ``shard_size``; groups are ordered by host."""
    hosts: dict[int, list[tuple[int, int]]] = {}
    for rank, (group, local) in enumerate(places):
        hosts.setdefault(group, []).append((local, rank))
    per_host = {group: [rank for _, rank in sorted(ranks)] for group, ranks in sorted(hosts.items())}
    counts = {group: len(ranks) for group, ranks in per_host.items()}
    if shard_size is None:
        if len(set(counts.values())) > 1:
            raise ConfigError(
                "strategy='hsdp' shards the model within each host, so every host must run the same "
                f"number of workers; the hosts run {_listed(counts)}. Start the same number of "
                "workers on every host (equal executors, workers a multiple of the hosts), or set "
                "strategy_options={'shard_size': k} with k dividing every host's count, or use "
                "strategy='fsdp'."
            )
        return list(per_host.values())
    uneven = {group: n for group, n in counts.items() if n % shard_size}
    if uneven:
        raise ConfigError(
            f"hsdp: shard_size={shard_size} must divide the workers of every host, for each shard "
            f"group to lie within one host; the hosts run {_listed(counts)}. Choose a shard_size "
            "that divides each of these, or leave it unset (a host's workers form one group)."
        )
    return [
        ranks[i : i + shard_size] for ranks in per_host.values() for i in range(0, len(ranks), shard_size)
    ]


def _listed(counts: dict[int, int]) -> str:
    return ", ".join(f"{n} (host {group})" for group, n in counts.items())
