"""The codecs: int8 rounding bounds, and error feedback keeping accumulated sums unbiased."""

from __future__ import annotations

import pytest
import torch

from sparkdp.comm.single import SingleProcessCollective
from sparkdp.errors import ConfigError
from sparkdp.strategies.compression import (
    DeltaReducer,
    check_codec,
    dequantize_int8,
    quantize_int8,
    wire_bytes,
)


def test_int8_rounding_is_within_half_a_step_of_each_block_scale():
    g = torch.Generator().manual_seed(0)
    flat = torch.cat([torch.zeros(1024), torch.randn(3000, generator=g), torch.randn(5, generator=g) * 1e6])
    values, scales = quantize_int8(flat)
    assert values.dtype == torch.int8 and scales.numel() == 4  # 4029 values in blocks of 1024
    back = dequantize_int8(values, scales, flat.numel())
    step = scales.repeat_interleave(1024)[: flat.numel()]
    assert torch.all((back - flat).abs() <= step / 2 + 1e-6 * flat.abs())
    assert torch.equal(back[:1024], torch.zeros(1024))  # an all-zero block stays zero


def _sums(codec: str, rounds: int, vector: torch.Tensor, feedback: bool) -> torch.Tensor:
    """What a rank sent over ``rounds`` rounds of the same vector, summed (a group of one, so
    the sum is exactly what was sent)."""
    reducer, total = DeltaReducer(codec), torch.zeros_like(vector)
    for _ in range(rounds):
        total += reducer.start(SingleProcessCollective(), vector.clone()).wait()
        if not feedback:
            reducer.reset()
    return total


@pytest.mark.parametrize(
    "codec,vector",
    [
        # a block with one large value: int8's step (1/127) rounds the small ones to zero every round
        ("int8", torch.tensor([1.0] + [1e-4] * 7)),
        # bfloat16 keeps 8 significant bits: 1 + 1e-3 is sent as 1 every round
        ("bf16", torch.tensor([1.0 + 1e-3, 3e-3])),
        ("fp16", torch.tensor([1.0 + 1e-4, 2.0 + 1e-4])),
    ],
)
def test_error_feedback_keeps_the_accumulated_sum_unbiased(codec, vector):
    rounds = 1000
    want = vector.double() * rounds
    without = _sums(codec, rounds, vector, feedback=False).double()
    with_feedback = _sums(codec, rounds, vector, feedback=True).double()
    assert (without - want).abs().max() > 0.05  # plain rounding drifts by about `rounds` roundings
    # with feedback the sum is off by one round's rounding at most (float32 accumulation aside)
    assert (with_feedback - want).abs().max() < 2e-2 * vector.abs().max() + 1e-3


def test_the_wire_bytes_of_each_codec():
    assert wire_bytes("none", 1000, 2) == 4000  # ring: 2 (N-1)/N of 4 bytes per value
    assert wire_bytes("bf16", 1000, 4) == 3000
    assert wire_bytes("int8", 4096, 3) == 2 * (4096 + 16)  # every other rank's values and 4 scales
    assert check_codec(None) == "none"
    with pytest.raises(ConfigError, match="compression must be one of 'none', 'bf16'"):
        check_codec("int4")


STEPS, BATCH = 10, 8


@pytest.fixture(scope="module")
def uncompressed():
    """One process on the concatenated batches, and two ranks sending float32 gradients."""
    from tests.helpers.dist import run_workers
    from tests.strategies.workers import train_compressed

    return (
        train_compressed(None, "none", STEPS, BATCH, False),
        run_workers(train_compressed, 2, "none", STEPS, BATCH, False),
    )


@pytest.mark.distributed
@pytest.mark.parametrize(
    "codec,shared,transport",
    [
        ("bf16", True, "shared-memory"),
        ("bf16", False, "process-group"),
        ("fp16", False, "process-group"),
        ("powersgd", True, "process-group"),  # PowerSGD's factors go through the process group
    ],
)
def test_compressed_gradients_keep_ranks_identical_near_the_reference(uncompressed, codec, shared, transport):
    from tests.helpers.dist import run_workers
    from tests.strategies.workers import train_compressed

    reference, plain = uncompressed
    ranks = run_workers(train_compressed, 2, codec, STEPS, BATCH, shared)
    (params, options, comm), (other, _, _) = ranks
    assert options["compression"] == codec and options["gradient_transport"] == transport, options
    assert all(torch.equal(a, b) for a, b in zip(params, other)), "ranks differ"
    drift = max((a - b).abs().max().item() for a, b in zip(params, reference))
    assert drift < (5e-2 if codec == "powersgd" else 5e-3), drift
    assert drift > 0 or codec == "powersgd"  # half precision rounds something
    ratio = comm["bytes_sent"] / plain[0][2]["bytes_sent"]
    # half precision: half the bytes. PowerSGD: two full steps, then the 64×32 weight as rank-2
    # factors, 2·(64 + 32) = 192 values; the 3×64 weight (too small to gain) and the biases whole
    want = 0.5 if codec != "powersgd" else (2 + 8 * (192 + 192 + 64 + 3) / 2307) / 10
    assert ratio == pytest.approx(want, rel=1e-3), ratio


@pytest.mark.distributed
@pytest.mark.parametrize("codec", ["int8", "bf16"])
def test_averaging_compressed_deltas_stays_near_plain_averaging(codec):
    from tests.helpers.dist import run_workers
    from tests.strategies.workers import train_sharded

    # momentum SGD, period 4, optimizer state averaged whole; parameters as compressed deltas
    plain = run_workers(train_sharded, 2, "average", 8, 4, "momentum", 4, True, True, True, True)
    ranks = run_workers(train_sharded, 2, "average", 8, 4, "momentum", 4, True, True, True, True, codec)
    (params, options), (other, _) = ranks
    assert options["compression"] == codec
    assert all(torch.equal(a, b) for a, b in zip(params, other)), "ranks differ"
    drift = max((a - b).abs().max().item() for a, b in zip(params, plain[0][0]))
    assert 0 < drift < 5e-3, drift
