"""The shared-memory all-reduce against sums computed here, on real gloo process groups."""

import pytest
import torch

from tests.comm.shm_workers import connect_when_one_rank_cannot_map, rank_tensor, reduce_many
from tests.helpers.dist import run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


@pytest.mark.parametrize("world", [2, 3])
def test_sums_equal_the_reference_on_every_rank_in_chunks(world):
    ranks = run_workers(reduce_many, world, 65536)  # 64 KiB slots: 50,021 floats take 4 chunks
    _one_barrier_on_two_ranks_with_the_same_bits(ranks, world)
    sizes = [(50_021, torch.float32), (3, torch.float64), (70_001, torch.bfloat16), (50_021, torch.float32)]
    for rank, out in enumerate(ranks):
        assert out["leftovers"] == [], f"rank {rank} still sees {out['leftovers']}"
        for got, (n, dtype) in zip(out["results"], sizes):
            want = sum(rank_tensor(r, n, torch.float64) for r in range(world)).to(dtype)
            assert got.dtype == dtype and torch.equal(got, want), f"rank {rank}, {n} x {dtype}"
        want_mean = sum(rank_tensor(r, 64, torch.float64) for r in range(world)).view(8, 8) / world
        torch.testing.assert_close(out["mean"], want_mean.float())
        assert out["wrapped"] == (0.0, (world + 1) / 2, (world + 1) / 2)
        assert out.get("accepted") is None
        assert len(out["refused"]) == 2 and all("contiguous CPU float" in m for m in out["refused"])
    assert all(torch.equal(a, b) for r in ranks[1:] for a, b in zip(r["results"], ranks[0]["results"]))


def test_every_rank_falls_back_when_one_cannot_share_memory():
    ranks = run_workers(connect_when_one_rank_cannot_map, 2)
    assert [r["reducer"] for r in ranks] == [False, False]
    assert ranks[0]["leftovers"] == []  # rank 0 removed its file all the same


def _one_barrier_on_two_ranks_with_the_same_bits(ranks: list, world: int) -> None:
    """Two ranks: one barrier per chunk by default, two when forced off; three: the reverse.
    Both algorithms give the same bits on random floats, whose sums depend on the order."""
    chunks = 4
    want = (
        sum(
            torch.randn(50_021, generator=torch.Generator().manual_seed(7 + r)).double() * 1e3
            for r in range(world)
        )
        / world
    )
    for rank, ranked in enumerate(ranks):
        out = ranked["barriers"]
        one, two = (out["default"], out["forced"]) if world == 2 else (out["forced"], out["default"])
        assert one["barriers"] == chunks and two["barriers"] == 2 * chunks, f"rank {rank}: {out}"
        assert torch.equal(one["result"], two["result"]), f"rank {rank}: the algorithms' bits differ"
        assert torch.equal(one["result"], ranks[0]["barriers"]["default"]["result"])  # every rank alike
        torch.testing.assert_close(one["result"].double(), want, rtol=1e-6, atol=1e-3)
