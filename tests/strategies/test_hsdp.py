"""strategy='hsdp' (FSDP2 on a replicas x shard-group mesh): one process's losses, 1/S of the state."""

import pytest
import torch

from sparkdp.comm.torchrun_env import Place, Placement, placement_from_env, placements, torchrun_env
from sparkdp.errors import ConfigError
from sparkdp.state import join_parts
from sparkdp.strategies import STRATEGIES
from sparkdp.strategies.hsdp import HSDP, shard_groups
from tests.helpers.dist import run_workers
from tests.strategies.sharded_workers import hsdp_then_resume


def _places(hosts):
    """(group rank, local rank) of every rank, from each rank's host name (torchrun's grouping)."""
    return [(p.group_rank, p.local_rank) for p in placements([Place(h) for h in hosts])]


def test_each_hosts_workers_form_a_shard_group_ordered_by_local_rank():
    # ranks 0, 2, 3 on host a and 1, 4, 5 on host b: each row is one host's ranks
    assert shard_groups(_places(["a", "b", "a", "a", "b", "b"]), None) == [[0, 2, 3], [1, 4, 5]]
    assert shard_groups(_places(["a", "a", "a", "a"]), None) == [[0, 1, 2, 3]]


def test_shard_size_splits_each_hosts_workers_into_groups_within_the_host():
    assert shard_groups(_places(["a"] * 4), 2) == [[0, 1], [2, 3]]
    assert shard_groups(_places(["a", "b", "a", "b"]), 1) == [[0], [2], [1], [3]]
    assert shard_groups(_places(["a", "b", "b", "a", "a", "b", "b", "a"]), 2) == [
        [0, 3],
        [4, 7],
        [1, 2],
        [5, 6],
    ]


def test_unequal_hosts_or_a_shard_size_that_does_not_divide_them_are_refused_with_what_to_do():
    with pytest.raises(ConfigError, match=r"same number of workers.*3 \(host 0\), 1 \(host 1\).*shard_size"):
        shard_groups(_places(["a", "a", "a", "b"]), None)
    with pytest.raises(
        ConfigError, match=r"shard_size=2 must divide the workers of every host.*3 \(host 0\)"
    ):
        shard_groups(_places(["a", "a", "a", "b"]), 2)
    with pytest.raises(ConfigError, match="hsdp: shard_size must be a positive integer"):
        HSDP(shard_size=0)
    assert STRATEGIES.create("hsdp", shard_size=2).options()["shard_size"] == 2
    with pytest.raises(ConfigError, match="fp16-mixed.*does not combine with strategy='hsdp'.*bf16-mixed"):
        HSDP().adopt_precision(torch.float16)


def test_hsdp_wire_bytes_are_the_gathers_within_a_group_and_the_shard_all_reduce_across():
    strategy = HSDP()
    strategy._mesh_shape = (2, 2)  # 2 replicas of 2 shards
    # 1000 values: two fp32 gathers + one fp32 reduce-scatter within 2 ranks (half a ring of
    # 12 bytes each: 6000), then each rank's 500-value fp32 gradient shard all-reduced over 2 (2000)
    assert strategy.wire_bytes(1000, 8, 4) == 6000 + 2000


def test_the_placement_is_read_back_from_torchruns_variables():
    placement = Placement(5, 8, 1, 4, 1, 2)
    assert placement_from_env(torchrun_env(placement, "127.0.0.1", 1234)) == placement
    assert placement_from_env({"RANK": "0"}) is None


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_hsdp_on_2_replicas_of_2_shards_trains_like_one_process_with_half_the_state(tmp_path):
    """4 workers as 2 "hosts" of 2 (shard_size=2): 10 AdamW steps give one process's losses on
    the global batches; each worker holds half the model state; the gathered model and optimizer
    state are the whole ones. They resume where torchrun's variables put ranks 0 and 2 on one
    host and 1 and 3 on another (the shards laid out anew) with the reference's next losses."""
    steps = 10
    out = run_workers(hsdp_then_resume, 4, str(tmp_path), steps, 2, ["a", "b", "a", "b"], timeout_s=200)
    ref = out[0]
    for rank, mine in enumerate(out):
        torch.testing.assert_close(mine["losses"], ref["reference"], rtol=1e-4, atol=0)
        assert mine["state_bytes"] <= (1 / 2 + 0.1) * ref["reference_bytes"], rank
        assert mine["state_bytes"] > (1 / 4 + 0.1) * ref["reference_bytes"], rank  # not fsdp's 1/4
        assert mine["options"]["mesh"] == [2, 2] and mine["resumed_options"]["mesh"] == [2, 2]
        assert mine["resumed_mesh"] == [[0, 2], [1, 3]]  # the rows are the hosts
    # the moments matter to the resumed steps: without them the second one differs
    assert float(out[0]["fresh_moments"][steps + 1]) != pytest.approx(
        float(out[0]["reference"][steps + 1]), rel=1e-4
    )
    first = out[0]
    # fit's result: the first replica's ranks (0 and 1) send their shards, the second replica none
    assert out[2]["share"] is None and out[3]["share"] is None
    joined = join_parts([mine["share"] for mine in out if mine["share"] is not None])
    assert list(joined) == list(first["model"])
    assert all(torch.equal(joined[key], value) for key, value in first["model"].items())
    assert first["model"].keys() == first["reference_model"].keys()
    for key, value in first["reference_model"].items():
        torch.testing.assert_close(first["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert first["moments"].keys() == first["reference_moments"].keys()
    for key in first["reference_moments"]:
        torch.testing.assert_close(
            first["moments"][key], first["reference_moments"][key], rtol=1e-3, atol=1e-9, msg=key
        )
