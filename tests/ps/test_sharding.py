import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdp.errors import ConfigError
from sparkdp.ps.sharding import BYTES_PER_SHARD, ShardPlan, default_num_shards


def _coverage(plan: ShardPlan) -> dict[int, list[int]]:
    seen = {i: [0] * spec.numel for i, spec in enumerate(plan.params)}
    for shard in plan.shards:
        for p in shard:
            for e in range(p.start, p.stop):
                seen[p.param][e] += 1
    return seen


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    k=st.integers(1, 6),
    split=st.sampled_from([0, 64, 4096]),
)
def test_every_element_exactly_once_and_reassembles_bit_exactly(sizes, k, split):
    params = [torch.randn(n, dtype=torch.float64 if i % 2 else torch.float32) for i, n in enumerate(sizes)]
    plan = ShardPlan.build(params, k, min_split_bytes=split)
    assert plan.num_shards <= k
    assert all(c == 1 for counts in _coverage(plan).values() for c in counts)
    rebuilt = [torch.full_like(p, float("nan")) for p in params]
    for s in range(plan.num_shards):
        for dst, src in zip(plan.views(rebuilt, s), plan.views(params, s), strict=True):
            dst.copy_(src)
    for a, b in zip(rebuilt, params, strict=True):
        assert torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b)


def test_one_huge_tensor_is_spread_over_all_shards_balanced():
    # the MXNet imbalance of docs/algorithms.md §8: a 3.2M-element FC weight plus small tensors
    params = [
        torch.zeros(32, 1, 5, 5),
        torch.zeros(32),
        torch.zeros(3136, 1024),
        torch.zeros(1024),
        torch.zeros(10),
    ]
    plan = ShardPlan.build(params, 4)
    sizes = plan.shard_bytes()
    assert plan.num_shards == 4
    assert max(sizes) - min(sizes) <= 64 * 1024, sizes
    assert all(any(p.param == 2 for p in shard) for shard in plan.shards), "the big weight must be split"


def test_small_tensors_are_never_split():
    plan = ShardPlan.build([torch.zeros(100) for _ in range(8)], 4)
    assert all(p.start == 0 and p.stop == 100 for shard in plan.shards for p in shard)
    assert [len(s) for s in plan.shards] == [2, 2, 2, 2]


def test_default_number_of_shards():
    assert default_num_shards(1000) == 1
    assert default_num_shards(3 * BYTES_PER_SHARD) == min(3, max(1, __import__("os").cpu_count()))
    assert default_num_shards(10**12) <= 8


def test_fewer_elements_than_shards_drops_empty_shards():
    plan = ShardPlan.build([torch.zeros(2)], 5)
    assert plan.num_shards == 1


def test_json_round_trip_and_bad_input():
    plan = ShardPlan.build([torch.zeros(2000, 100), torch.zeros(3, dtype=torch.int64)], 3)
    assert ShardPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ConfigError, match="num_shards"):
        ShardPlan.build([torch.zeros(3)], 0)
    with pytest.raises(ValueError, match=r"expected dtype=torch.float32 shape=\(2000, 100\)"):
        plan.check([torch.zeros(2000, 99), torch.zeros(3, dtype=torch.int64)])
    assert math.prod(plan.params[0].shape) == 200_000
