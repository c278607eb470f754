"""Fuzzing what the driver reads back from its tasks: task results and ``fsdp``/``hsdp`` shares.

Task results: documents forged around stored tensors (references to a tensor named once, twice
or never, the codec's tags in any place, nesting past the bound), mutated encodings of real
results, and result rows with any task index, part and part count. FSDP shares: the true shards
of a tensor (``torch.chunk``'s, empty ones after), then slices of another width, dtype or length,
counts and indices anywhere up to 10**12, parts dropped or repeated, and mutated bytes.

The only outcomes allowed are the value, or ``ValueError`` (``WorkerFailed`` for rows); and what
comes back holds no more tensor, bytes or array data than the input's bytes -- the bound that a
result naming one tensor many times, or a share claiming 10**12 slices, once broke.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save as st_save

from sparkdp import state
from sparkdp.errors import WorkerFailed
from sparkdp.spark.launcher import _result_batch, _results
from sparkdp.spark.results import decode, encode
from sparkdp.train.report import WorkerReport
from tests.fuzz.test_fuzz_decoders import _mutate

from .budget import fuzz_settings, hang_guard

FUZZ = fuzz_settings(500)
pytestmark = hang_guard(500)


def _data_bytes(value) -> int:
    """The tensor, bytes and array data ``value`` holds (two values on one storage count twice:
    the aliasing a forged document could cause is as much a breach as copies)."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(_data_bytes(k) + _data_bytes(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_data_bytes(v) for v in value)
    if isinstance(value, WorkerReport):
        return sum(_data_bytes(v) for v in vars(value).values())
    return 0


def _decode_within_bound(cell: bytes, bound: int) -> None:
    """``cell`` decoded holds at most ``bound`` bytes of data, or is refused with ValueError."""
    try:
        value = decode(cell, "s", 0)
    except ValueError:
        return
    assert _data_bytes(value) <= bound


# ------------------------------------------------------------------ task results
_NAMES = st.sampled_from(["t0", "t0", "t0", "t1", "t9", 0, None, []])  # stored, not stored, not names
_TENSOR = _NAMES.map(lambda name: {"__tensor__": name})
_LEAVES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.text(max_size=3),
    _TENSOR,
    _TENSOR.map(lambda t: {"__bytes__": t}),
    _TENSOR.map(lambda t: {"__ndarray__": t}),
    st.sampled_from([{"__bytes__": "x"}, {"__ndarray__": 1}, {"__record__": ["WorkerReport", {}]}]),
)


def _wrapped(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(lambda v: {"__tuple__": v}),
        st.dictionaries(st.sampled_from(["a", "b", "__bytes__", "__tensor__"]), inner, max_size=3),
        st.lists(st.tuples(st.integers(0, 3), inner).map(list), max_size=3).map(lambda v: {"__items__": v}),
        st.lists(st.tuples(st.text(max_size=2), inner).map(list), max_size=3).map(
            lambda v: {"__result_items__": v}
        ),
        inner.map(lambda v: {"__record__": ["WorkerReport", {"state": v}]}),
    )


_DOCUMENTS = st.recursive(_LEAVES, _wrapped, max_leaves=8)
#: one tensor with data, so that any value holding it twice exceeds the bound
_STORED = {"t0": torch.arange(64, dtype=torch.uint8), "t1": torch.zeros(0, dtype=torch.float64)}


@FUZZ
@given(
    _DOCUMENTS,
    st.integers(0, 66) | st.sampled_from([319, 321, 400]),
    st.sampled_from(["[", '{"__tuple__": [', '{"a": ']),
)
def test_forged_result_documents_decode_within_their_size_or_raise_value_error(value, depth, wrapper):
    """References to one tensor from many places, tags anywhere, nesting to 400 levels."""
    closing = {"[": "]", '{"__tuple__": [': "]}", '{"a": ': "}"}[wrapper]
    document = json.dumps({"format": "sparkdp-result/1", "stage": "s", "index": 0, "value": None})
    document = document.replace("null", wrapper * depth + json.dumps(value) + closing * depth)
    stored = sum(t.nbytes for t in _STORED.values())  # what the cell holds: each tensor once at most
    _decode_within_bound(st_save(_STORED, metadata={state.META_KEY: document}), stored)


@FUZZ
@given(st.integers(1, 5000), st.sampled_from(["__bytes__", "__ndarray__", None]))
def test_one_tensor_named_by_many_references_is_refused(count, tag):
    """The amplification itself, at every count: one 64-byte tensor named ``count`` times."""
    reference = {"__tensor__": "t0"} if tag is None else {tag: {"__tensor__": "t0"}}
    value = json.dumps({"format": "sparkdp-result/1", "stage": "s", "index": 0, "value": [reference] * count})
    cell = st_save({"t0": _STORED["t0"]}, metadata={state.META_KEY: value})
    if count == 1:
        assert _data_bytes(decode(cell, "s", 0)) == 64
    else:
        with pytest.raises(ValueError, match="names tensor 't0' twice"):
            decode(cell, "s", 0)


_RESULTS = st.recursive(
    st.one_of(
        st.none(),
        st.integers(-5, 5),
        st.binary(max_size=8),
        st.integers(0, 3).map(lambda n: torch.arange(n, dtype=torch.float32)),
        st.integers(0, 3).map(lambda n: np.arange(n, dtype=np.int16)),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", 1, (2, "x"), "__bytes__"]), inner, max_size=3),
    ),
    max_leaves=6,
)


@FUZZ
@given(st.data())
def test_mutated_results_decode_within_their_size_or_raise_value_error(data):
    cell = _mutate(data, encode("s", 0, data.draw(_RESULTS)))
    _decode_within_bound(cell, len(cell))


_ROWS = [batch.to_pylist()[0] for batch in (_result_batch("s", 0, [1]), _result_batch("s", 1, {"b": b"x"}))]


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sampled_from([-1, 0, 1, 2, 10**12]),
            st.sampled_from([-1, 0, 1, 2, 10**12]),
            st.sampled_from([-1, 0, 1, 2, 10**12]),
        ),
        max_size=4,
    )
)
def test_result_rows_with_any_index_part_and_count_are_read_or_refused(rows):
    """A stage's rows as Spark hands them over, their task index, part and part count forged."""
    forged = [
        {**_ROWS[row], "index": index, "part": part, "parts": parts} for row, index, part, parts in rows
    ]
    try:
        back = _results(forged, "s", 2)
    except WorkerFailed:
        return
    assert back == [[1], {"b": b"x"}]


# ------------------------------------------------------------------ FSDP shares
def _chunks(whole: torch.Tensor, count: int) -> list[torch.Tensor]:
    """FSDP2's dim-0 shards: torch.chunk's pieces, then empty ones up to ``count``."""
    pieces = list(torch.chunk(whole, count))
    return pieces + [whole[:0]] * (count - len(pieces))


_FORGED = st.sampled_from([-1, 0, 1, 2, 5, 10**12])


@st.composite
def _shares(draw):
    """(parts, the true tensor or None where a slice or its declaration was changed)."""
    rows, width, count = draw(st.integers(0, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    whole = torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)
    slices = _chunks(whole, count)
    declared = [[i, count, rows] for i in range(count)]
    changed = False
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(slices) - 1))
        change = draw(
            st.sampled_from(["dtype", "width", "length", "index", "count", "rows", "drop", "repeat"])
        )
        changed = True
        if change == "dtype":
            slices[at] = slices[at].double()
        elif change == "width":
            slices[at] = torch.zeros(slices[at].shape[0], width + 1)
        elif change == "length":
            slices[at] = torch.zeros(draw(st.integers(0, 4)), width)
        elif change in ("index", "count", "rows"):
            declared[at][["index", "count", "rows"].index(change)] = draw(_FORGED)
        elif change == "drop" and len(slices) > 1:
            del slices[at], declared[at]
        elif change == "repeat":
            slices.append(slices[at])
            declared.append(list(declared[at]))
    parts = [
        state.part_to_bytes({"w": piece, "b": torch.ones(1)}, {"w": tuple(where)})
        for piece, where in zip(slices, declared, strict=True)
    ]
    return parts, None if changed else whole


def _join_within_bound(parts: list[bytes]) -> dict[str, torch.Tensor] | None:
    try:
        joined = state.join_parts(parts)
    except ValueError:
        return None
    assert _data_bytes(joined) <= sum(len(p) for p in parts)
    return joined


@FUZZ
@given(_shares())
def test_fsdp_shares_join_into_torch_cat_of_the_true_shards_or_raise_value_error(shares):
    parts, whole = shares
    joined = _join_within_bound(parts)
    if whole is not None:  # the true shards: torch.cat of them, which is the tensor
        assert joined is not None and joined["w"].dtype == whole.dtype and torch.equal(joined["w"], whole)
    elif joined is not None:  # changed, yet joined: the slices given, in order, as declared
        layouts = [
            json.loads(
                json.loads(p[8 : 8 + int.from_bytes(p[:8], "little")])["__metadata__"][state.PART_KEY]
            )["w"]
            for p in parts
        ]
        count, rows = layouts[0][1], layouts[0][2]
        pieces = {where[0]: state.state_from_bytes(p)["w"] for where, p in zip(layouts, parts, strict=True)}
        reference = torch.cat([pieces[i] for i in range(count)])
        assert joined["w"].shape[0] == rows and joined["w"].dtype == reference.dtype
        assert torch.equal(joined["w"], reference)


@FUZZ
@given(st.data())
def test_mutated_fsdp_shares_join_or_raise_value_error(data):
    parts, _ = data.draw(_shares())
    at = data.draw(st.integers(0, len(parts) - 1))
    parts[at] = _mutate(data, parts[at])
    _join_within_bound(parts)
