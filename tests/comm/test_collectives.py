import pytest
import torch

from sparkdp.comm import SingleProcessCollective
from tests.helpers.dist import run_workers
from tests.strategies.workers import collective_sum


def test_single_process_collective_is_identity():
    coll = SingleProcessCollective()
    t = torch.tensor([1.0, 2.0])
    assert coll.all_reduce(t, "sum") is t and t.tolist() == [1.0, 2.0]
    assert coll.rank == 0 and coll.world_size == 1


@pytest.mark.distributed
def test_gloo_collectives_against_hand_computed_values():
    results = run_workers(collective_sum, 2)
    for rank, r in enumerate(results):
        assert r["sum"].tolist() == [3.0, 3.0, 3.0], f"rank {rank}: {r['sum']}"
        assert r["same"].tolist() == [0.0, 2.0, 4.0, 6.0], f"rank {rank}: {r['same']}"
        assert r["many"][0].tolist() == [1.5, 1.5] and r["many"][1].tolist() == [10.0] * 3
        assert r["many"][1].dtype == torch.float64
        assert r["bcast"].tolist() == [1.0, 1.0], f"rank {rank} got {r['bcast']} from rank 1"
