"""Wire codec of the parameter server: fixed header + small JSON + raw tensor bytes.

Never pickle (design rule 7 of docs/architecture.md; sparktorch's ``dill.loads`` and elephas's ``pickle.loads``
on network input are remote code execution).  A frame is::

    fixed header   28 bytes  !4sBBHQIQ  magic "SDPS", protocol version, op, flags,
                                        sequence number, JSON length, payload length
    JSON header    json_len  {"worker":..,"versions":..,"tensors":[{"dtype","shape","offset"}]}
    (transport)              the transport inserts its MACs here and after the payload
    payload        payload_len raw tensor bytes, each tensor at a 64-byte aligned offset

Both lengths are checked against :class:`Limits` *before* anything is allocated, so a
forged length field cannot make the receiver allocate 2**64 bytes.  Dtypes come from a
whitelist; shapes and offsets are validated against the payload length.

Zero copy: encoding hands out ``memoryview``\\ s of the (contiguous) tensors themselves;
decoding returns views into the received buffer (``torch.frombuffer`` for a bytearray, or
``uint8_tensor[off:off+n].view(dtype)`` for a receive buffer allocated as a tensor).
Offsets are 64-byte aligned so that every view is aligned for its dtype.
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sparkdp.errors import ProtocolError

MAGIC = b"SDPS"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("!4sBBHQIQ")
HEADER_SIZE = HEADER.size  # 28
ALIGN = 64
#: Bounds of a tensor descriptor's shape.  The payload length already bounds a tensor's bytes,
#: but not a zero-size tensor's other dimensions ([0, 10**30] would pass), and torch refuses
#: shapes whose strides overflow int64 with TypeError/RuntimeError, not ProtocolError.  No
#: parameter comes near either bound.
MAX_NDIM = 32
MAX_ELEMENTS = 2**48  # product of the non-zero dimensions: strides stay far inside int64


class Op(enum.IntEnum):
    """Message kinds; a request's reply carries the same sequence number."""

    HELLO = 1  # server -> client: nonce (handshake, unauthenticated)
    AUTH = 2  # client -> server: worker id, nonce, proof (handshake)
    AUTH_OK = 3  # server -> client: server proof + model description (first MAC'd frame)
    PULL = 4
    PULL_REPLY = 5
    PUSH = 6
    PUSH_REPLY = 7
    ERROR = 8  # reply to a request that failed on the server (e.g. a NaN push)
    BYE = 9  # client closes politely
    REPORT = 10  # client -> server: a monitoring record (JSON only, no reply; sparkdp.monitor)
    INIT = 11  # client -> server: the initial centre, for a server started without one (first one wins)
    INIT_REPLY = 12  # server -> client: the model description, as in AUTH_OK
    QUORUM = 13  # worker -> driver's quorum: at a step boundary, how its last step went (driver.quorum)
    QUORUM_REPLY = 14  # driver -> worker: the quorum of the next step, and whether the last one commits
    HEARTBEAT = 15  # worker -> driver's quorum: still alive (no reply)
    HEAL = 16  # worker -> driver's quorum: a live peer's state for a joining worker (sparkdp state bytes)
    ASK = 17  # client -> server: a monitoring record that wants an answer (JSON only; sparkdp.monitor)
    ANSWER = 18  # server -> client: the answer to an ASK (JSON only)


class Flag(enum.IntFlag):
    NONE = 0
    PAYLOAD_MAC = 1  # a MAC over the payload follows it


#: Whitelisted dtypes by wire name.  Complex, quantized and sparse layouts are refused.
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float16, torch.bfloat16, torch.float32, torch.float64,
        torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
    )
}  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """Largest message a receiver accepts (checked before allocating).

    Raise ``max_payload_bytes`` for models above ~500M fp32 parameters.
    """

    max_json_bytes: int = 2**20
    max_payload_bytes: int = 2 * 2**30


@dataclass(frozen=True)
class FrameHeader:
    op: Op
    flags: Flag
    seq: int
    json_len: int
    payload_len: int

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC, PROTOCOL_VERSION, self.op, self.flags, self.seq, self.json_len, self.payload_len
        )

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, limits: Limits) -> FrameHeader:
        """Parse and validate; raises ProtocolError saying which field is wrong."""
        if len(data) != HEADER_SIZE:
            raise ProtocolError(f"frame header has {len(data)} bytes, expected {HEADER_SIZE}.")
        magic, version, op, flags, seq, json_len, payload_len = HEADER.unpack(data)
        if magic != MAGIC:
            raise ProtocolError(
                f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: the peer does not speak sparkdp."
            )
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {version}, this sparkdp speaks {PROTOCOL_VERSION}: "
                "use the same sparkdp version on the driver and the executors."
            )
        try:
            op, flags = Op(op), Flag(flags)
        except ValueError:
            raise ProtocolError(f"unknown op {op} or flags {flags:#x}.") from None
        if json_len > limits.max_json_bytes:
            raise ProtocolError(
                f"JSON header of {json_len} bytes exceeds the limit of {limits.max_json_bytes}."
            )
        if payload_len > limits.max_payload_bytes:
            raise ProtocolError(
                f"payload of {payload_len} bytes exceeds the limit of {limits.max_payload_bytes}; "
                "raise Limits.max_payload_bytes on both sides if the model really is that large."
            )
        return cls(op, flags, seq, json_len, payload_len)


def dtype_from_name(name: object) -> torch.dtype:
    try:
        return DTYPES[name]  # type: ignore[index]  # any wire value: a non-str or unhashable one fails below
    except (KeyError, TypeError):
        raise ProtocolError(f"dtype {name!r} is not allowed; allowed: {', '.join(DTYPES)}.") from None


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


_PAD = memoryview(bytes(ALIGN))


def payload_bytes(nbytes: Sequence[int]) -> int:
    """The largest payload of a frame carrying tensors of these byte sizes, in this order: each
    starts at an ``ALIGN``-aligned offset (:func:`layout`), so at most ``ALIGN - 1`` padding bytes
    precede each."""
    return sum(_aligned(n) for n in nbytes)


def layout(tensors: Sequence[Tensor]) -> tuple[list[dict[str, Any]], list[memoryview], int]:
    """Describe ``tensors`` and return (descriptors, buffers to send in order, payload length).

    Contiguous CPU tensors are not copied; others are made contiguous (one copy).
    """
    descs: list[dict[str, Any]] = []
    buffers: list[memoryview] = []
    offset = 0
    for i, t in enumerate(tensors):
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(
                f"tensor {i} has dtype {t.dtype}, which the wire does not carry; allowed: {', '.join(DTYPES)}."
            )
        start = _aligned(offset)
        if start > offset:
            buffers.append(_PAD[: start - offset])
        t = t.detach().to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        if nbytes:
            buffers.append(t.view(-1).view(torch.uint8).numpy().data)
        descs.append({"dtype": name, "shape": list(t.shape), "offset": start})
        offset = start + nbytes
    return descs, buffers, offset


def as_byte_tensor(buf: Tensor | bytes | bytearray | memoryview) -> Tensor:
    """A 1-D uint8 tensor over ``buf`` (no copy for bytearray / writable memoryview)."""
    if isinstance(buf, Tensor):
        return buf
    mv = memoryview(buf)
    if mv.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if mv.readonly:  # torch.frombuffer warns on read-only buffers; copy once (test paths only)
        mv = memoryview(bytearray(mv))
    return torch.frombuffer(mv, dtype=torch.uint8)


def decode_tensors(descs: object, payload: Tensor | bytes | bytearray | memoryview) -> list[Tensor]:
    """Views into ``payload`` described by ``descs``; ProtocolError on anything inconsistent."""
    data = as_byte_tensor(payload)
    if not isinstance(descs, list):
        raise ProtocolError(f"'tensors' must be a list of descriptors, got {type(descs).__name__}.")
    out: list[Tensor] = []
    end = 0
    for i, d in enumerate(descs):
        if not isinstance(d, dict) or set(d) != {"dtype", "shape", "offset"}:
            raise ProtocolError(
                f"tensor descriptor {i} must have exactly dtype, shape, offset; got {d!r:.200}."
            )
        dtype, shape, offset = dtype_from_name(d["dtype"]), d["shape"], d["offset"]
        if not (isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)):
            raise ProtocolError(f"tensor {i}: shape must be a list of non-negative ints, got {shape!r:.200}.")
        if len(shape) > MAX_NDIM:
            raise ProtocolError(
                f"tensor {i}: shape has {len(shape)} dimensions, at most {MAX_NDIM} are allowed."
            )
        if math.prod(x for x in shape if x) > MAX_ELEMENTS:
            raise ProtocolError(
                f"tensor {i}: shape {shape!r:.200}'s dimensions other than 0 multiply to more than "
                f"{MAX_ELEMENTS} (2**48), the most a descriptor may declare."
            )
        if type(offset) is not int or offset < end or offset % ALIGN:
            raise ProtocolError(
                f"tensor {i}: offset {offset!r} is not {ALIGN}-aligned and increasing (previous end {end})."
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes > data.numel():
            raise ProtocolError(
                f"tensor {i}: bytes [{offset}, {offset + nbytes}) exceed the payload of {data.numel()} bytes."
            )
        if nbytes == 0:
            out.append(torch.empty(shape, dtype=dtype))
        else:
            out.append(data[offset : offset + nbytes].view(dtype).view(shape))
        end = offset + nbytes
    return out


def dump_json(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()


def load_json(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    try:
        meta = json.loads(bytes(data))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"JSON header does not parse: {exc}"[:300]) from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"JSON header must be an object, got {type(meta).__name__}.")
    return meta


@dataclass
class Message:
    """A decoded frame without its transport envelope."""

    op: Op
    seq: int
    meta: dict[str, Any]
    tensors: list[Tensor]


def encode(op: Op, seq: int, meta: dict[str, Any], tensors: Sequence[Tensor] = (), flags: Flag = Flag.NONE):
    """Return (header bytes, JSON bytes, payload buffers, payload length) for one frame."""
    descs, buffers, payload_len = layout(tensors)
    body = dump_json({**meta, "tensors": descs})
    header = FrameHeader(op, flags, seq, len(body), payload_len).pack()
    return header, body, buffers, payload_len


def encode_to_bytes(op: Op, seq: int, meta: dict[str, Any], tensors: Sequence[Tensor] = ()) -> bytearray:
    """A whole frame (no MACs) in one bytearray: for the in-process transport and tests."""
    header, body, buffers, _ = encode(op, seq, meta, tensors)
    out = bytearray(header)
    out += body
    for b in buffers:
        out += b
    return out


def decode_from_bytes(frame: bytes | bytearray | memoryview, limits: Limits = Limits()) -> Message:
    """Inverse of :func:`encode_to_bytes`; tensors are views into ``frame`` when it is writable."""
    mv = memoryview(frame)
    if mv.nbytes < HEADER_SIZE:
        raise ProtocolError(f"frame of {mv.nbytes} bytes is shorter than the {HEADER_SIZE}-byte header.")
    head = FrameHeader.unpack(mv[:HEADER_SIZE], limits)
    total = HEADER_SIZE + head.json_len + head.payload_len
    if mv.nbytes != total:
        raise ProtocolError(f"frame has {mv.nbytes} bytes, its header announces {total}.")
    meta = load_json(mv[HEADER_SIZE : HEADER_SIZE + head.json_len])
    tensors = decode_tensors(meta.pop("tensors", []), mv[HEADER_SIZE + head.json_len :])
    return Message(head.op, head.seq, meta, tensors)
