"""Fuzzing the binary decoders: ``.caffemodel`` files, Caffe Datum records and sparkdp state bytes.

Each target gets noise and mutations of valid encodings (bit flips, truncation, inserted
and duplicated bytes, varints at their extremes). The only outcomes allowed are a result
or the documented error type (``CaffemodelError``; ``DataError``; ``ValueError``) -- no
other exception, no hang.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sparkdp import state
from sparkdp.caffe.caffemodel import (
    CaffeLayerBlobs,
    CaffemodelError,
    decode_net,
    encode_blob_proto,
    encode_net,
    len_field,
    read_blob_proto,
    varint_bytes,
)
from sparkdp.caffe.datum import decode_datum, encode_datum
from sparkdp.errors import DataError

from .budget import fuzz_settings, hang_guard

# Mutated inputs are small and decode in microseconds: 500 examples keep the quick run at a
# few seconds per target.
FUZZ = fuzz_settings(500)
pytestmark = hang_guard(500)

# Varints at their extremes: 0, the largest one-byte value, int32/int64 boundaries, all
# ten bytes set (bits beyond 64), and an unterminated run.
_EXTREME_VARINTS = [
    b"\x00",
    b"\x7f",
    b"\x80\x01",
    b"\xff\xff\xff\xff\x07",
    b"\xff\xff\xff\xff\x0f",
    b"\xff" * 9 + b"\x00",
    b"\x80" * 9 + b"\x01",
    b"\xff" * 9 + b"\x01",
    b"\xff" * 9 + b"\x7f",
    b"\xff" * 10,
    b"\x80" * 11,
]


def _mutate(data: st.DataObject, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        i = data.draw(st.integers(0, len(buf)), label="at")
        action = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "duplicate", "varint"]))
        if action == "flip" and i < len(buf):
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "set" and i < len(buf):
            buf[i] = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x05, 0x7F, 0x80, 0xFF]))
        elif action == "cut":
            buf = buf[:i]
        elif action == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        elif action == "duplicate" and buf:
            j = data.draw(st.integers(i, min(len(buf), i + 64)))
            buf[j:j] = buf[i:j] * data.draw(st.integers(1, 3))
        elif action == "varint":
            extreme = data.draw(st.sampled_from(_EXTREME_VARINTS))
            if data.draw(st.booleans()):
                buf[i:i] = extreme
            else:
                buf[i : i + len(extreme)] = extreme
    return bytes(buf)


# ------------------------------------------------------------------ .caffemodel
_SHAPES = st.lists(st.integers(0, 4), max_size=4).map(tuple)


@st.composite
def _caffemodels(draw) -> bytes:
    layers = []
    for i in range(draw(st.integers(0, 3))):
        shapes = draw(st.lists(_SHAPES, max_size=2))
        blobs = [np.arange(int(np.prod(s)), dtype=np.float32).reshape(s) for s in shapes]
        layers.append(
            CaffeLayerBlobs(f"l{i}", draw(st.sampled_from(["InnerProduct", "Convolution", ""])), blobs)
        )
    return encode_net(layers, name=draw(st.sampled_from(["", "net"])))


def _field(number: int, payload: bytes) -> bytes:
    return len_field(number, len(payload)) + payload


@st.composite
def _v1_caffemodels(draw) -> bytes:
    """V1 ``layers`` (enum types, legacy num/channels/height/width blobs), some with a V0 layer inside."""
    out = b""
    for i in range(draw(st.integers(1, 3))):
        dims = draw(st.lists(st.integers(0, 3), min_size=4, max_size=4))
        blob = b"".join(varint_bytes(n << 3) + varint_bytes(d) for n, d in enumerate(dims, start=1))
        blob += _field(5, np.ones(int(np.prod(dims)), "<f4").tobytes())
        if draw(st.booleans()):  # V0: name (1), type (2) and blobs (50) in a nested `layer`
            body = _field(1, _field(1, f"v{i}".encode()) + _field(2, b"conv") + _field(50, blob))
        else:
            body = _field(4, f"l{i}".encode()) + varint_bytes(5 << 3) + varint_bytes(draw(st.integers(0, 40)))
            body += _field(6, blob)
        out += _field(2, body)
    return out


# Dimensions whose products wrap around in 64 bits (2**32 * 2**32, 3 * 6148914691236517206),
# exceed an int64, are negative, or are more than a blob can have.
_EXTREME_DIMS = st.sampled_from(
    [
        0,
        1,
        3,
        1 << 31,
        1 << 32,
        (1 << 63) - 1,
        1 << 63,
        (1 << 64) - 1,
        -1,
        6148914691236517206,
        12297829382473034411,
    ]
)


@st.composite
def _extreme_shape_caffemodels(draw) -> bytes:
    dims = draw(st.lists(_EXTREME_DIMS | st.integers(0, 4), max_size=40))
    values = np.ones(draw(st.integers(0, 4)), "<f4").tobytes()
    if draw(st.booleans()):
        shape = _field(7, _field(1, b"".join(varint_bytes(d) for d in dims)))
    else:  # legacy num/channels/height/width
        shape = b"".join(varint_bytes(n << 3) + varint_bytes(d) for n, d in enumerate(dims[:4], start=1))
    return _field(100, _field(1, b"x") + _field(7, _field(5, values) + shape))


def _decode_net_or_documented_error(data: bytes) -> None:
    try:
        net = decode_net(data, "fuzz.caffemodel")
    except CaffemodelError:
        return
    for layer in net.layers:
        for blob in layer.blobs:
            assert blob.size == int(np.prod(blob.shape))


@FUZZ
@given(st.binary(max_size=300))
def test_noise_caffemodels_decode_or_raise_caffemodel_error(raw):
    _decode_net_or_documented_error(raw)


@FUZZ
@given(st.data())
def test_mutated_caffemodels_decode_or_raise_caffemodel_error(data):
    _decode_net_or_documented_error(_mutate(data, data.draw(_caffemodels() | _v1_caffemodels())))


@FUZZ
@given(_extreme_shape_caffemodels())
def test_caffemodels_with_extreme_blob_shapes_decode_or_raise_caffemodel_error(data):
    _decode_net_or_documented_error(data)


@pytest.fixture(scope="module")
def blob_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "mean.binaryproto"


@FUZZ
@given(st.data())
def test_mutated_blob_proto_files_read_or_raise_caffemodel_error(blob_file, data):
    shape = data.draw(_SHAPES)
    blob_file.write_bytes(_mutate(data, encode_blob_proto(np.ones(shape, np.float32))))
    try:
        read_blob_proto(blob_file)
    except CaffemodelError:
        pass


# ------------------------------------------------------------------------ Datum
def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4)).save(out, format="PNG")
    return out.getvalue()


_PNG = _png()


@st.composite
def _datums(draw) -> bytes:
    kind = draw(st.sampled_from(["uint8", "float", "png", "jpg"]))
    shape = (draw(st.sampled_from([1, 3])), draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    label = draw(st.integers(-(1 << 31), (1 << 31) - 1))
    if kind == "float":
        return encode_datum(np.ones(shape, np.float32), label)
    arr = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    return encode_datum(arr, label, encoding=None if kind == "uint8" else kind)


def _decode_datum_or_documented_error(record: bytes) -> None:
    for color in (None, True):
        try:
            array, _ = decode_datum(record, color=color, source="fuzz")
        except DataError:
            continue
        assert array.ndim == 3


@FUZZ
@given(st.binary(max_size=200))
def test_noise_datums_decode_or_raise_data_error(record):
    _decode_datum_or_documented_error(record)


@FUZZ
@given(st.data())
def test_mutated_datums_decode_or_raise_data_error(data):
    _decode_datum_or_documented_error(_mutate(data, data.draw(_datums())))


@FUZZ
@given(st.data())
def test_datums_with_mutated_images_decode_or_raise_data_error(data):
    """Damaged image files inside an ``encoded`` Datum: what Pillow raises must become a DataError."""
    image = _mutate(data, _PNG)
    record = b"\x22" + bytes(_varint(len(image))) + image + b"\x38\x01"
    _decode_datum_or_documented_error(record)


def _varint(v: int) -> bytearray:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return out


# ------------------------------------------------------------------ state bytes
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.integers(0, 3).map(lambda n: torch.arange(n, dtype=torch.float32)),
)


def _containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
        st.dictionaries(st.integers(0, 9), inner, max_size=3),
    )


_STATES = st.recursive(_LEAVES, _containers, max_leaves=6)


def _from_bytes_or_value_error(data: bytes) -> None:
    try:
        state.from_bytes(data)
    except ValueError:
        pass


@FUZZ
@given(st.binary(max_size=300))
def test_noise_state_bytes_load_or_raise_value_error(data):
    _from_bytes_or_value_error(data)


@FUZZ
@given(st.data())
def test_mutated_state_bytes_load_or_raise_value_error(data):
    _from_bytes_or_value_error(_mutate(data, state.to_bytes(data.draw(_STATES))))


@FUZZ
@given(st.data())
def test_state_bytes_with_a_mutated_header_load_or_raise_value_error(data):
    """Mutations aimed at the JSON header (tensor offsets, dtypes, the sparkdp skeleton)."""
    raw = state.to_bytes(data.draw(_STATES))
    size = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + size].decode()
    i = data.draw(st.integers(0, len(header)))
    piece = data.draw(
        st.sampled_from(
            [
                '"',
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                "0",
                "-1",
                "1e999",
                "18446744073709551616",
                '"__tensor__"',
                '"__items__"',
                '"__tuple__"',
                '"t9"',
                "null",
                "[" * 2000,
            ]
        )
    )
    header = header[:i] + piece + header[i + data.draw(st.integers(0, 3)) :]
    encoded = header.encode()
    _from_bytes_or_value_error(len(encoded).to_bytes(8, "little") + encoded + raw[8 + size :])


@FUZZ
@given(st.data())
def test_state_bytes_with_a_mutated_skeleton_load_or_raise_value_error(data):
    """Well-formed safetensors whose ``sparkdp`` skeleton is damaged: what ``unflatten`` reads."""
    from safetensors.torch import save

    skeleton, tensors = state.flatten(data.draw(_STATES))
    i = data.draw(st.integers(0, len(skeleton)))
    piece = data.draw(
        st.sampled_from(
            [
                '"',
                "{",
                "}",
                "[",
                "]",
                ",",
                ":",
                "0",
                "-1",
                "1e999",
                "NaN",
                "null",
                '{"__tensor__": "t9"}',
                '{"__tensor__": []}',
                '{"__items__": 1}',
                '{"__items__": [[[], 1]]}',
                '{"__items__": [[1]]}',
                '{"__tuple__": 5}',
                '"__tensor__"',
                "[" * 5000 + "]" * 5000,
                '{"a":' * 5000 + "1" + "}" * 5000,
            ]
        )
    )
    skeleton = skeleton[:i] + piece + skeleton[i + data.draw(st.integers(0, 3)) :]
    _from_bytes_or_value_error(save(tensors, metadata={state.META_KEY: skeleton}))
