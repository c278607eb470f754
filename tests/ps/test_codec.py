import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkdp.errors import ProtocolError
from sparkdp.ps import codec
from sparkdp.ps.codec import DTYPES, HEADER, MAGIC, Limits, Op

shapes = st.lists(st.integers(0, 7), min_size=0, max_size=4)


def _random(dtype, shape):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


@settings(max_examples=80, deadline=None)
@given(
    specs=st.lists(st.tuples(st.sampled_from(sorted(DTYPES)), shapes), max_size=6),
    seq=st.integers(0, 2**64 - 1),
)
def test_round_trip_any_whitelisted_dtype_and_shape(specs, seq):
    tensors = [_random(DTYPES[d], s) for d, s in specs]
    msg = codec.decode_from_bytes(codec.encode_to_bytes(Op.PUSH, seq, {"worker": 3}, tensors))
    assert (msg.op, msg.seq, msg.meta) == (Op.PUSH, seq, {"worker": 3})
    assert len(msg.tensors) == len(tensors)
    for a, b in zip(msg.tensors, tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_zero_size_non_contiguous_and_no_copy_decode():
    x = torch.arange(24.0).reshape(4, 6)
    tensors = [x.t(), x[:, ::2], torch.empty(0, 3), torch.empty(2, 0, dtype=torch.int64), torch.tensor(5.0)]
    frame = codec.encode_to_bytes(Op.PULL_REPLY, 1, {}, tensors)
    msg = codec.decode_from_bytes(frame)
    for a, b in zip(msg.tensors, tensors, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    # decoded tensors are views into the frame: writing the frame changes them
    json_len = HEADER.unpack(frame[: codec.HEADER_SIZE])[5]
    payload_start = codec.HEADER_SIZE + json_len
    offset = json.loads(bytes(frame[codec.HEADER_SIZE : payload_start]))["tensors"][0]["offset"]
    frame[payload_start + offset : payload_start + offset + 4] = struct.pack("<f", 42.0)
    assert msg.tensors[0].flatten()[0] == 42.0


def test_encode_hands_out_views_of_contiguous_tensors():
    t = torch.ones(1000)
    _, _, buffers, _ = codec.encode(Op.PUSH, 0, {}, [t])
    t[0] = 7.0
    assert torch.frombuffer(bytearray(buffers[0]), dtype=torch.float32)[0] == 7.0


def _frame(op=Op.PUSH, version=codec.PROTOCOL_VERSION, magic=MAGIC, json_len=None, payload_len=0, body=b"{}"):
    json_len = len(body) if json_len is None else json_len
    return HEADER.pack(magic, version, op, 0, 0, json_len, payload_len) + body


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (_frame(magic=b"HTTP"), "bad magic"),
        (_frame(version=9), "protocol version 9"),
        (_frame(op=77), "unknown op 77"),
        (_frame(json_len=2**31), "JSON header of 2147483648 bytes exceeds"),
        (_frame(payload_len=2**63), "payload of 9223372036854775808 bytes exceeds"),
        (_frame(body=b"{not json"), "does not parse"),
        (_frame(body=b"[1]"), "must be an object"),
        (_frame(body=b"[" * 100_000), "does not parse"),
        (b"SDPS", "shorter than"),
        (_frame() + b"x", "header announces"),
    ],
)
def test_malformed_frames_raise_protocol_error(frame, match):
    with pytest.raises(ProtocolError, match=match):
        codec.decode_from_bytes(frame)


@pytest.mark.parametrize(
    ("descs", "match"),
    [
        ([{"dtype": "object", "shape": [1], "offset": 0}], "dtype 'object' is not allowed"),
        ([{"dtype": "float32", "shape": [1], "offset": 0, "code": "x"}], "exactly dtype, shape, offset"),
        ([{"dtype": "float32", "shape": [-1], "offset": 0}], "non-negative ints"),
        ([{"dtype": "float32", "shape": [1.5], "offset": 0}], "non-negative ints"),
        ([{"dtype": "float32", "shape": [1], "offset": 3}], "aligned"),
        ([{"dtype": "float32", "shape": [2**40], "offset": 0}], "exceed the payload"),
        ("nope", "must be a list"),
        # zero-size tensors whose other dimensions torch cannot hold (TypeError / RuntimeError there)
        ([{"dtype": "float32", "shape": [0, 10**30], "offset": 0}], "dimensions other than 0 multiply"),
        ([{"dtype": "float32", "shape": [0, 2**63 - 1, 2**63 - 1], "offset": 0}], "dimensions other than 0"),
        ([{"dtype": "uint8", "shape": [0] * 65, "offset": 0}], "65 dimensions, at most 32"),
    ],
)
def test_bad_tensor_descriptors(descs, match):
    with pytest.raises(ProtocolError, match=match):
        codec.decode_tensors(descs, bytearray(64))


def test_the_largest_allowed_zero_size_shape_decodes():
    widest = [0, 2**24, 2**24]  # the non-zero dimensions multiply to exactly the bound
    [t] = codec.decode_tensors([{"dtype": "float64", "shape": widest, "offset": 0}], bytearray(0))
    assert list(t.shape) == widest and t.numel() == 0
    [t] = codec.decode_tensors([{"dtype": "bool", "shape": [1] * 32, "offset": 0}], bytearray(1))
    assert t.dim() == 32


def test_limits_are_configurable_and_checked_before_allocation():
    frame = codec.encode_to_bytes(Op.PUSH, 0, {}, [torch.zeros(100)])
    with pytest.raises(ProtocolError, match="exceeds the limit of 64"):
        codec.decode_from_bytes(frame, Limits(max_payload_bytes=64))


def test_unsupported_dtype_is_refused_on_encode():
    with pytest.raises(ValueError, match="complex64"):
        codec.encode(Op.PUSH, 0, {}, [torch.zeros(2, dtype=torch.complex64)])
