"""Synchronous strategies against the single-process reference on the concatenated batch."""

import pytest
import torch

from tests.helpers.dist import run_workers
from tests.strategies.workers import single_process, train_sharded

pytestmark = pytest.mark.distributed
STEPS, BATCH, WORLD = 8, 4, 2


def _assert_close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.allclose(g, w, atol=1e-5, rtol=1e-4), (
            f"{what}: tensor {i} differs by {(g - w).abs().max()}"
        )


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_allreduce_equals_one_process_on_concatenated_batch(optimizer):
    ranks = run_workers(train_sharded, WORLD, "allreduce", STEPS, BATCH, optimizer)
    reference = single_process(STEPS, BATCH, WORLD, optimizer)
    for rank, params in enumerate(ranks):
        _assert_close(params, reference, f"allreduce/{optimizer} rank {rank}")


def test_shared_memory_and_gloo_transports_give_the_reference():
    reference = single_process(STEPS, BATCH, WORLD, "momentum")
    for shared, transport in [(True, "shared-memory"), (False, "process-group")]:
        ranks = run_workers(
            train_sharded, WORLD, "allreduce", STEPS, BATCH, "momentum", 1, False, True, shared, True
        )
        for rank, (params, options) in enumerate(ranks):
            assert options["gradient_transport"] == transport, options
            _assert_close(params, reference, f"{transport} rank {rank}")
        assert all(torch.equal(a, b) for a, b in zip(ranks[0][0], ranks[1][0])), f"{transport}: ranks differ"


def test_gradients_as_bucket_views_change_nothing_but_copies():
    views = run_workers(train_sharded, WORLD, "allreduce", STEPS, BATCH, "momentum", 1, False, True)
    copies = run_workers(train_sharded, WORLD, "allreduce", STEPS, BATCH, "momentum", 1, False, False)
    for rank in range(WORLD):
        assert all(torch.equal(a, b) for a, b in zip(views[rank], copies[rank])), f"rank {rank} differs"


def test_average_k1_plain_sgd_equals_single_machine_sgd():
    ranks = run_workers(train_sharded, WORLD, "average", STEPS, BATCH, "sgd", 1)
    _assert_close(ranks[0], single_process(STEPS, BATCH, WORLD, "sgd"), "average k=1")
    _assert_close(ranks[1], ranks[0], "ranks agree")


@pytest.mark.parametrize("shared,transport", [(True, "shared-memory"), (False, "process-group")])
def test_average_with_momentum_state_equals_the_reference_on_both_transports(shared, transport):
    ranks = run_workers(
        train_sharded, WORLD, "average", STEPS, BATCH, "momentum", 1, True, True, shared, True
    )
    reference = single_process(STEPS, BATCH, WORLD, "momentum")
    for rank, (params, options) in enumerate(ranks):
        assert options["parameter_transport"] == transport, options
        _assert_close(params, reference, f"average/{transport} rank {rank}")


def test_average_k1_momentum_needs_averaged_optimizer_state():
    reference = single_process(STEPS, BATCH, WORLD, "momentum")
    with_state = run_workers(train_sharded, WORLD, "average", STEPS, BATCH, "momentum", 1, True)
    _assert_close(with_state[0], reference, "average k=1 momentum with averaged velocity")


def test_average_k4_is_local_sgd_not_equal_but_ranks_agree_at_the_end():
    ranks = run_workers(train_sharded, WORLD, "average", STEPS, BATCH, "sgd", 4)
    _assert_close(ranks[1], ranks[0], "final averaging")
    reference = single_process(STEPS, BATCH, WORLD, "sgd")
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(ranks[0], reference))
