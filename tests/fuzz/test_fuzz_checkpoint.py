"""Fuzzing checkpoint loading: a damaged or crafted file is skipped on resume, never crashes it.

Two kinds of input: mutations of a real checkpoint's bytes (flips, cuts, growth, header
rewrites: mostly caught by the parser or the digest), and crafted files whose digest is
*correct* but whose JSON skeleton is arbitrary (what an attacker or a buggy writer can make,
since the digest is no signature). The only outcomes allowed are a well-typed ``Checkpoint``
or ``ValueError`` -- what ``latest_checkpoint`` skips with a warning.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as st_save

from sparkdp.config import CheckpointConfig
from sparkdp.state import META_KEY
from sparkdp.train.checkpoint import Checkpoint, CheckpointPolicy, parse_checkpoint, save_checkpoint
from sparkdp.train.checkpoint_store import digest

EXAMPLES = int(os.environ.get("SPARKDP_FUZZ_EXAMPLES", "1500"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES < 10_000,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
pytestmark = pytest.mark.timeout(max(120, EXAMPLES // 20))  # make fuzz: a hang guard, not a budget


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    directory = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    path = save_checkpoint(
        CheckpointPolicy(CheckpointConfig(str(directory)), job_id="fuzz"),
        epoch=1,
        step=4,
        model=model.state_dict(),
        optimizer=b"\x01\x02\x03",
        strategy_state={"k": (1, None)},
        rng=[torch.get_rng_state()],
        history=[{"loss": 0.5}],
        workers=2,
    )
    return open(path, "rb").read()


def _parse_or_value_error(data: bytes) -> None:
    try:
        ck = parse_checkpoint(data, "fuzzed")
    except ValueError:
        return
    assert isinstance(ck, Checkpoint)
    assert all(isinstance(v, torch.Tensor) for v in ck.model.values())
    assert isinstance(ck.epoch, int) and isinstance(ck.step, int) and isinstance(ck.optimizer, bytes)


def test_the_valid_checkpoint_parses(valid):
    ck = parse_checkpoint(valid, "valid")
    assert (ck.epoch, ck.step, ck.workers, ck.job_id, ck.optimizer) == (1, 4, 2, "fuzz", b"\x01\x02\x03")


@FUZZ
@given(data=st.data())
def test_mutated_checkpoints_load_or_raise_value_error(valid, data):
    blob = bytearray(valid)
    (header_size,) = struct.unpack("<Q", blob[:8])
    for _ in range(data.draw(st.integers(1, 4))):
        if len(blob) < 9:
            break
        action = data.draw(st.sampled_from(["flip", "cut", "grow", "size", "header"]))
        i = data.draw(st.integers(0, len(blob) - 1))
        if action == "flip":
            blob[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            blob = blob[:i]
        elif action == "grow":
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=64))
        elif action == "size":  # the u64 header length at its extremes
            blob[:8] = struct.pack(
                "<Q",
                data.draw(
                    st.sampled_from([0, 1, header_size - 1, header_size + 1, len(blob), 2**63, 2**64 - 1])
                ),
            )
        else:  # a byte of the JSON header replaced by JSON punctuation
            j = data.draw(st.integers(8, min(8 + header_size, len(blob)) - 1))
            blob[j] = ord(data.draw(st.sampled_from('{}[]",:0-e ')))
    _parse_or_value_error(bytes(blob))


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "format",
                    "epoch",
                    "step",
                    "model",
                    "optimizer",
                    "strategy_state",
                    "rng",
                    "history",
                    "workers",
                    "epoch_stats",
                    "job_id",
                    "__tensor__",
                    "__items__",
                    "__tuple__",
                    "t0",
                    "x",
                ]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=20,
)


@FUZZ
@given(
    skeleton=_JSON,
    tensors=st.dictionaries(
        st.sampled_from(["t0", "t1"]),
        st.integers(0, 4).map(lambda n: torch.arange(n, dtype=torch.uint8)),
        max_size=2,
    ),
)
def test_crafted_skeletons_with_a_correct_digest_load_or_raise_value_error(skeleton, tensors):
    for text in (json.dumps(skeleton), json.dumps({"job_id": "fuzz", "series": "ckpt", "state": skeleton})):
        _parse_or_value_error(st_save(tensors, metadata={META_KEY: text, "sha256": digest(tensors, text)}))
