"""torchrun's environment from where the ranks run (``sparkdp.comm.torchrun_env``), against
hand-worked tables."""

from __future__ import annotations

import os

import pytest

from sparkdp.comm.torch_dist import set_torch_distributed_env
from sparkdp.comm.torchrun_env import Place, Placement, placements, torchrun_env


def _table(places: list[Place]) -> list[tuple[int, int, int, int]]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE) by rank."""
    out = []
    for rank, p in enumerate(placements(places)):
        assert (p.rank, p.world_size) == (rank, len(places))
        out.append((p.local_rank, p.local_world_size, p.group_rank, p.group_world_size))
    return out


@pytest.mark.parametrize(
    ("places", "expected"),
    [
        # two CPU workers on one host (local[2])
        ([Place("h"), Place("h")], [(0, 2, 0, 1), (1, 2, 0, 1)]),
        # ranks alternate between two hosts: each host's ranks by global rank, hosts by their first rank
        (
            [Place("a"), Place("b"), Place("a"), Place("b")],
            [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)],
        ),
        # uneven hosts; the second host's first rank is rank 0
        (
            [Place("b"), Place("a"), Place("a"), Place("b"), Place("c")],
            [(0, 2, 0, 3), (0, 2, 1, 3), (1, 2, 1, 3), (1, 2, 0, 3), (0, 1, 2, 3)],
        ),
        # GPUs 1 and 0 given to ranks 0 and 1: LOCAL_RANK follows the GPU (cuda:LOCAL_RANK is the task's)
        ([Place("h", 1), Place("h", 0)], [(1, 2, 0, 1), (0, 2, 0, 1)]),
        # executors narrowed to one GPU each (CUDA_VISIBLE_DEVICES 2 and 3, both cuda:0): a group each
        ([Place("h", 0, "2"), Place("h", 0, "3")], [(0, 1, 0, 2), (0, 1, 1, 2)]),
        # CPU workers share their host whatever their processes' CUDA_VISIBLE_DEVICES
        ([Place("h", None, "0"), Place("h", None, "1")], [(0, 2, 0, 1), (1, 2, 0, 1)]),
        # a host where one rank has no GPU: by rank
        ([Place("h", 1), Place("h")], [(0, 2, 0, 1), (1, 2, 0, 1)]),
    ],
    ids=["one-host", "alternating", "uneven", "gpus-by-ordinal", "narrowed", "cpu-visibility", "mixed"],
)
def test_local_ranks_by_host(places, expected):
    assert _table(places) == expected


def test_the_whole_torchrun_environment():
    placement = Placement(
        rank=3, world_size=4, local_rank=1, local_world_size=2, group_rank=1, group_world_size=2
    )
    assert torchrun_env(
        placement, "10.0.0.7", 29500, run_id="spark-stage-12", restart_count=1, max_restarts=0
    ) == {
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29500",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_NAME": "default",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "TORCHELASTIC_RUN_ID": "spark-stage-12",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def test_the_process_environment_is_set_and_a_foreign_placement_refused():
    placement = Placement(1, 2, 0, 1, 1, 2)
    set_torch_distributed_env("127.0.0.1", 1234, 1, 2, placement, run_id="r", restart_count=2)
    assert [
        os.environ[k]
        for k in (
            "RANK",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_RUN_ID",
        )
    ] == ["1", "0", "1", "1", "2", "2", "r"]
    set_torch_distributed_env("127.0.0.1", 1234, 1, 2)  # no placement: every rank on this host
    assert (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"], os.environ["GROUP_WORLD_SIZE"]) == (
        "1",
        "2",
        "1",
    )
    with pytest.raises(ValueError, match="is not rank 0 of 2"):
        set_torch_distributed_env("127.0.0.1", 1234, 0, 2, placement)
