"""DiLoCo against hand-worked outer steps, against parameter averaging, and its compression."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparkdp import state as state_io
from sparkdp.comm.single import SingleProcessCollective
from sparkdp.errors import ConfigError
from sparkdp.strategies import DiLoCo
from tests.helpers.dist import run_workers
from tests.strategies.workers import make_problem, train_diloco, train_sharded

pytestmark = pytest.mark.timeout(120)
BATCH = 4


def _close(got, want, what, atol=1e-5):
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(g, w, atol=atol, rtol=1e-4), (
            f"{what}: tensor {i} differs by {(g - w).abs().max()}"
        )


def by_hand(
    steps: int,
    period: int,
    *,
    lr: float = 0.7,
    momentum: float = 0.9,
    nesterov: bool = True,
    fragments: tuple[tuple[tuple[int, ...], int], ...] | None = None,
    overlap: int = 0,
    mixing: float = 0.5,
) -> list[torch.Tensor]:
    """One worker: plain SGD inner steps; every `period` steps (at each fragment's offset) the
    delta g − θ is the outer gradient of torch-free momentum SGD, written out term by term."""
    model, x, y = make_problem()
    params = list(model.parameters())
    fragments = fragments or ((tuple(range(len(params))), 0),)
    outer = [p.detach().clone() for p in params]
    buffers: dict[int, torch.Tensor] = {}
    in_flight: dict[int, tuple[int, list[torch.Tensor]]] = {}

    def outer_step(indices, deltas):
        for i, d in zip(indices, deltas):
            buffers[i] = d.clone() if i not in buffers else momentum * buffers[i] + d
            update = d + momentum * buffers[i] if nesterov else buffers[i]
            outer[i] = outer[i] - lr * update

    for step in range(1, steps + 1):
        lo = (step - 1) * BATCH
        loss = nn.functional.cross_entropy(model(x[lo : lo + BATCH]), y[lo : lo + BATCH])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.1 * g
            for f, (due, deltas) in list(in_flight.items()):
                if step >= due:
                    del in_flight[f]
                    outer_step(fragments[f][0], deltas)
                    for i in fragments[f][0]:
                        params[i].mul_(mixing).add_(outer[i], alpha=1 - mixing)
            for f, (indices, offset) in enumerate(fragments):
                if step % period == offset:
                    deltas = [outer[i] - params[i] for i in indices]
                    if overlap:
                        in_flight[f] = (step + overlap, deltas)
                    else:
                        outer_step(indices, deltas)
                        for i in indices:
                            params[i].copy_(outer[i])
    return [p.detach().clone() for p in params]


def run_one(steps: int, **options) -> tuple[list[torch.Tensor], DiLoCo]:
    model, x, y = make_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = DiLoCo(**options)
    strategy.setup(model, opt, SingleProcessCollective())
    for step in range(steps):
        lo = step * BATCH
        strategy.add_samples(BATCH)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[lo : lo + BATCH]), y[lo : lo + BATCH]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], strategy


def test_one_worker_equals_nesterov_outer_steps_by_hand():
    got, _ = run_one(12, period=4)
    _close(got, by_hand(12, 4), "diloco H=4, Nesterov outer SGD")


def test_plain_momentum_and_an_adam_outer_optimizer():
    got, _ = run_one(8, period=2, outer_nesterov=False, outer_lr=0.5)
    _close(got, by_hand(8, 2, lr=0.5, nesterov=False), "heavy-ball outer SGD")
    got, strategy = run_one(4, period=2, outer_optimizer="Adam", outer_lr=0.01)
    assert isinstance(strategy._outer, torch.optim.Adam) and strategy.options()["outer_optimizer"] == "Adam"


def test_fragments_are_synced_at_their_own_offsets():
    # make_problem's tensors hold 40, 8, 24 and 3 values: two byte-balanced fragments are the
    # first weight alone (synced mid-period) and the rest (synced at the period's end)
    got, strategy = run_one(12, period=4, fragments=2)
    assert strategy._groups == [[0], [1, 2, 3]]
    _close(got, by_hand(12, 4, fragments=(((0,), 2), ((1, 2, 3), 0))), "two fragments")


def test_overlapped_reductions_merge_with_the_steps_taken_meanwhile():
    got, _ = run_one(11, period=4, overlap_steps=1, mixing=0.5)
    _close(got, by_hand(11, 4, overlap=1, mixing=0.5), "overlap 1 step")


@pytest.mark.distributed
def test_period_one_with_outer_sgd_lr_one_equals_parameter_averaging():
    options = {"period": 1, "outer_lr": 1.0, "outer_momentum": 0.0, "shared_memory": False}
    diloco = run_workers(train_diloco, 2, 8, BATCH, options)
    averaged = run_workers(train_sharded, 2, "average", 8, BATCH, "sgd", 1, False, True, False)
    for rank in range(2):
        _close(diloco[rank][0], averaged[rank], f"rank {rank}")


@pytest.fixture(scope="module")
def float32_run():
    """Two ranks, period 4, float32 deltas: what the compressed runs are compared with."""
    return run_workers(train_diloco, 2, 16, BATCH, {"period": 4, "shared_memory": False})


@pytest.mark.distributed
@pytest.mark.parametrize(
    "codec,atol,ratio", [("int8", 5e-3, (0.2, 0.3)), ("bf16", 1e-2, (0.5, 0.5)), ("fp16", 1e-2, (0.5, 0.5))]
)
def test_compressed_deltas_keep_ranks_identical_and_close_to_float32(float32_run, codec, atol, ratio):
    runs = run_workers(
        train_diloco, 2, 16, BATCH, {"period": 4, "shared_memory": False, "compression": codec}
    )
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0])), "ranks differ"
    _close(runs[0][0], float32_run[0][0], f"{codec} against float32", atol=atol)
    sent = runs[0][2]["bytes_sent"] / float32_run[0][2]["bytes_sent"]
    assert ratio[0] <= sent <= ratio[1], sent  # int8: a quarter, and one scale per tensor-sized block
    assert runs[0][1]["compression"] == codec


def test_the_outer_state_survives_a_checkpoint():
    whole, _ = run_one(8, period=2)
    model, x, y = make_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = DiLoCo(period=2)
    first.setup(model, opt, SingleProcessCollective())
    for step in range(8):
        if step == 4:  # resume from what a checkpoint holds: model, steps, outer momentum
            assert first.replicas_agree()
            saved = state_io.from_bytes(state_io.to_bytes(first.state_dict()))
            first.finish()
            second = DiLoCo(period=2)
            second.load_state_dict(saved)
            second.setup(model, opt, SingleProcessCollective())
            assert second._steps == 4
        lo = step * BATCH
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[lo : lo + BATCH]), y[lo : lo + BATCH]).backward()
        opt.step()
    _close([p.detach() for p in model.parameters()], whole, "resumed")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"period": 0}, "period must be a positive integer"),
        ({"period": 4, "fragments": 5}, "cannot exceed period"),
        ({"period": 4, "fragments": 2, "overlap_steps": 2}, "must be less than period / fragments"),
        ({"outer_optimizer": "adamw2"}, "no torch.optim optimizer named 'adamw2'"),
        ({"compression": "int4"}, "compression must be one of"),
        ({"mixing": 1.5}, "mixing must be in"),
    ],
)
def test_bad_settings_say_what_is_allowed(options, message):
    with pytest.raises(ConfigError, match=message):
        DiLoCo(**options)
