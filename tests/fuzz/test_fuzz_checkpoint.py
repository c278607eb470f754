"""Fuzzing checkpoint loading: a damaged or crafted file is skipped on resume, never crashes it.

Two kinds of input: mutations of a real checkpoint's bytes (flips, cuts, growth, header
rewrites: mostly caught by the parser or the digest), and crafted files whose digest is
*correct* but whose JSON skeleton is arbitrary (what an attacker or a buggy writer can make,
since the digest is no signature). The only outcomes allowed are a well-typed ``Checkpoint``
or ``ValueError`` -- what ``latest_checkpoint`` skips with a warning.

Sharded checkpoints' manifests are fuzzed the same way: generated part names (the format's, and
absolute, ``../``, separators, empty, odd), digests (right, altered, of the wrong form or type),
part sizes (exact, cut, grown, missing) and manifest fields, each planted with its bytes where the
store would read it. The store either accepts the manifest -- and then every name is one of the
format's and every part read matches its digest -- or refuses it with ``ValueError``; reading
writes nothing anywhere.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save as st_save

from sparkdp.config import CheckpointConfig
from sparkdp.state import META_KEY
from sparkdp.train.checkpoint import (
    Checkpoint,
    CheckpointPolicy,
    latest_checkpoint,
    parse_checkpoint,
    save_checkpoint,
)
from sparkdp.train.checkpoint_store import LOOP_PART, CheckpointStore, digest
from sparkdp.train.sharded_checkpoint import shard_part

from .budget import SLOW_INPUTS, examples, fuzz_settings, hang_guard

FUZZ = fuzz_settings(1500, suppress=(*SLOW_INPUTS, HealthCheck.function_scoped_fixture))
pytestmark = hang_guard(1500)


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


# ---------------------------------------------------------------- sharded checkpoints' manifests

_FORMAT_PARTS = [LOOP_PART, shard_part(0), shard_part(1), shard_part(99_999), shard_part(100_000)]
_HOSTILE_PARTS = [
    "",
    ".",
    "..",
    "../loop-state",
    "../../escaped",
    "/tmp/escaped.pth",
    "//escaped",
    "a/loop-state",
    "loop-state/",
    "loop-state\n",
    "./loop-state",
    "C:\\escaped",
    "shard-1-model-00001-of-00001.safetensors",
    "shard-000001-model-00001-of-00001.safetensors",
    "shard-00001-model-00001-of-00001.safetensors/../../escaped",
    "loop-state\x00",
    "\u2024\u2024/escaped",
]
_PART_NAMES = st.sampled_from(_FORMAT_PARTS) | st.sampled_from(_HOSTILE_PARTS) | st.text(max_size=12)


@st.composite
def _manifests(draw):
    """(manifest bytes, {part name: the bytes planted for it, or None for none}): a manifest of
    job ``fuzz``'s checkpoint at epoch 1 whose parts, digests, sizes and fields are generated."""
    parts, planted = {}, {}
    for name in draw(st.lists(_PART_NAMES, max_size=4, unique=True)):
        data = draw(st.binary(max_size=16))
        sha = hashlib.sha256(data).hexdigest()
        digest_kind = draw(st.sampled_from(["right", "right", "altered", "short", "upper", "other"]))
        parts[name] = {
            "right": sha,
            "altered": sha[:-1] + ("0" if sha[-1] != "0" else "1"),
            "short": sha[:-1],
            "upper": sha.upper(),
            "other": draw(st.none() | st.integers() | st.lists(st.text(max_size=2), max_size=2)),
        }[digest_kind]
        size = draw(st.sampled_from(["exact", "exact", "cut", "grown", "missing"]))
        planted[name] = {"exact": data, "cut": data[:-1], "grown": data + b"\x00", "missing": None}[size]
    manifest = {"format": 1, "job_id": "fuzz", "series": "shards", "parts": parts}
    for key in draw(st.lists(st.sampled_from(["format", "job_id", "series", "parts"]), max_size=2)):
        manifest[key] = draw(st.none() | st.integers(0, 2) | st.text(max_size=6) | st.just({}))
    raw = json.dumps(manifest).encode()
    mangle = draw(st.sampled_from(["none", "none", "none", "cut", "bytes", "deep"]))
    if mangle == "cut":
        raw = raw[: draw(st.integers(0, len(raw)))]
    elif mangle == "bytes":
        raw = draw(st.binary(max_size=32))
    elif mangle == "deep":
        raw = b"[" * draw(st.integers(1, 100_000))
    return raw, planted


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _plant(directory: Path, name: str, data: bytes, sandbox: Path) -> None:
    """``data`` where the store reads part ``name`` of ``directory``, if that is inside the
    sandbox (a hostile name's bytes too: only the name check keeps them from being used)."""
    if "\x00" in name:
        return
    target = Path(os.path.normpath(f"{directory}/{name}"))
    if target.is_relative_to(sandbox) and target != directory and not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@settings(FUZZ, max_examples=examples(300))
@given(case=_manifests())
def test_fuzzed_manifests_are_accepted_as_valid_or_refused_with_value_error_and_write_nothing(case):
    raw, planted = case
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp) / "sandbox"
        checkpoints = sandbox / "a" / "b" / "ckpts"
        name = "shards-e00001-s00000000-fuzz.manifest.json"
        directory = checkpoints / name.removesuffix(".manifest.json")
        directory.mkdir(parents=True)
        for part, data in planted.items():
            if data is not None:
                _plant(directory, part, data, sandbox)
        (checkpoints / name).write_bytes(raw)
        before = _files(Path(tmp))
        store = CheckpointStore(str(checkpoints), "reader")
        try:
            manifest = store.manifest(name)
        except ValueError:
            manifest = None
        if manifest is not None:
            for part in manifest["parts"]:  # what restore joins to its temporary directory stays in it
                assert Path(tmp, part).resolve().parent == Path(tmp).resolve(), part
                assert part == LOOP_PART or shard_part(int(part.split("-")[1]) - 1) == part, part
            try:
                for part, data in store.read_directory(name).items():
                    assert hashlib.sha256(data).hexdigest() == manifest["parts"][part]
            except (ValueError, FileNotFoundError):  # a part cut, grown or missing
                pass
        found = latest_checkpoint(checkpoints)  # skips what it cannot use; raises nothing
        assert found is None or isinstance(found, Checkpoint)
        assert _files(Path(tmp)) == before  # reading wrote nothing, inside or outside
