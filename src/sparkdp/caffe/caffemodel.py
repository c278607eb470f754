"""Read and write ``.caffemodel`` files (protobuf binary NetParameter) without protobuf.

Only what weights need is decoded: layer names, types and blobs, from current
(``layer``, field 100), V1 (``layers``, field 2, enum types, legacy 4-D blobs) and
V0 (``layers { layer { ... } }``) files.  Every other field is skipped by wire type.
Packed floats are read with ``numpy.frombuffer``, so decoding costs little more
than reading the file.  Any truncation or corruption raises
:class:`CaffemodelError` with the byte offset and what was expected.

Example:
    >>> import numpy as np
    >>> blob = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> data = encode_net([CaffeLayerBlobs("ip", "InnerProduct", [blob])])
    >>> decode_net(data).layers[0].blobs[0].shape
    (2, 3)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..errors import ConfigError
from . import spec

__all__ = [
    "CaffeLayerBlobs", "CaffemodelError", "DecodedNet", "V1_LAYER_TYPES",
    "decode_net", "encode_blob_proto", "encode_net", "read_blob_proto", "read_caffemodel", "write_caffemodel",
]  # fmt: skip


class CaffemodelError(ConfigError):
    """A ``.caffemodel`` that is truncated, corrupt or not a NetParameter."""


# V1LayerParameter.LayerType enum number -> V2 type string (UpgradeV1LayerType); 0 (NONE) -> "".
V1_LAYER_TYPES: dict[int, str] = {
    n: spec.V1_LAYER_TYPES.get(name, "") for n, name in spec.V1_LAYER_TYPE_NUMBERS.items()
}

# V0 type strings (UpgradeV0LayerType): the V1 type names, lower-cased, that Caffe's V0
# upgrade knows (others stay as written, as Caffe rejects them), plus four V0-only names.
_V0_AS_V1 = (
    "ACCURACY BNLL CONCAT DATA DROPOUT EUCLIDEAN_LOSS FLATTEN HDF5_DATA HDF5_OUTPUT IM2COL INFOGAIN_LOSS "
    "LRN MULTINOMIAL_LOGISTIC_LOSS RELU SIGMOID SOFTMAX SOFTMAX_LOSS SPLIT TANH WINDOW_DATA"
).split()
_V0_LAYER_TYPES = {name.lower(): spec.V1_LAYER_TYPES[name] for name in _V0_AS_V1} | {
    "conv": "Convolution",
    "images": "ImageData",
    "innerproduct": "InnerProduct",
    "pool": "Pooling",
}

VARINT, I64, LEN, I32 = 0, 1, 2, 5
WIRE_NAMES = {0: "varint", 1: "64-bit", 2: "length-delimited", 5: "32-bit"}
_U64 = (1 << 64) - 1
#: Caffe's limits on a blob (``blob.hpp``): at most 32 axes (``kMaxBlobAxes``), and at most
#: INT_MAX values, since ``Blob::Reshape`` counts them in an ``int``.
MAX_BLOB_AXES = 32
MAX_BLOB_VALUES = (1 << 31) - 1
#: Limits of sparkdp's own (Caffe has none), far above any published net, so that a file of
#: tiny empty entries cannot make the decoder build millions of Python objects: layers, blobs in
#: all, and net-level inputs (``input``, ``input_shape``; ``input_dim`` 4 per input).
MAX_LAYERS = 100_000
MAX_BLOBS = 200_000
MAX_NET_INPUTS = 1024


@dataclass
class CaffeLayerBlobs:
    """One layer's name, V2 type and parameter blobs as stored in the file.

    Attributes:
        name: layer name (weights are matched by it).
        type: V2 type string ("Convolution"...; V1 enums and V0 strings upgraded).
        blobs: float32 arrays (float64 if the file used ``double_data``) with the
            file's shapes.
        legacy_4d: per blob, True if its shape came from num/channels/height/width
            (to be compared right-aligned with the net's shape).
    """

    name: str
    type: str
    blobs: list[np.ndarray] = field(default_factory=list)
    legacy_4d: list[bool] = field(default_factory=list)


@dataclass
class DecodedNet:
    """A decoded NetParameter.

    Attributes:
        name: the net's name.
        layers: the layers in file order.
        version: "V2", "V1" or "V0".
        inputs: deprecated net-level ``input`` names (old deploy files).
        input_shapes: their shapes, from ``input_shape`` or groups of 4 ``input_dim``.
    """

    name: str
    layers: list[CaffeLayerBlobs]
    version: str
    inputs: list[str] = field(default_factory=list)
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)


class WireReader:
    """Bounds-checked protobuf wire reading over one buffer, absolute offsets.

    ``error(offset, expected)`` makes the exception for corrupt input (default: a
    :class:`CaffemodelError` that says what a ``.caffemodel`` should be); the Datum reader
    (``caffe/datum.py``) passes its own."""

    def __init__(
        self, buf: bytes | memoryview, source: str, error: Callable[[int, str], Exception] | None = None
    ) -> None:
        self.buf = memoryview(buf).cast("B")
        self.source = source
        self._error = error

    def fail(self, offset: int, expected: str) -> Exception:
        if self._error is not None:
            return self._error(offset, expected)
        return CaffemodelError(
            f"{self.source}: truncated or corrupt .caffemodel at byte offset {offset}: expected "
            f"{expected}. Is this a complete Caffe NetParameter binary file (not a prototxt, "
            "an HDF5 snapshot or a partial download)?"
        )

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        result, shift, start = 0, 0, pos
        buf = self.buf
        while True:
            if pos >= end:
                raise self.fail(start, "the rest of a varint, found the end of the data")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                # a 10th byte can carry bits beyond 64: protobuf drops them, and so must we, or a
                # "64-bit" value would be larger than any int64/uint64 the fields can hold
                return result & _U64, pos
            shift += 7
            if shift >= 70:
                raise self.fail(start, "a varint of at most 10 bytes")

    def fields(self, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
        """Yield ``(field_number, wire_type, value_or_start, value_end, tag_offset)``.

        For varints ``value_or_start`` is the value; for other wire types it is
        the start of the payload and ``value_end`` its end.
        """
        while pos < end:
            tag_at = pos
            tag, pos = self.varint(pos, end)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise self.fail(tag_at, "a field tag with a field number > 0")
            if wire == VARINT:
                value, pos = self.varint(pos, end)
                yield number, wire, value, pos, tag_at
                continue
            if wire == LEN:
                length, pos = self.varint(pos, end)
                size = length
            elif wire in (I64, I32):
                size = 8 if wire == I64 else 4
            else:
                raise self.fail(tag_at, f"wire type 0, 1, 2 or 5 for field {number}, found {wire}")
            if pos + size > end:
                raise self.fail(pos, f"{size} bytes of field {number}, only {end - pos} left")
            yield number, wire, pos, pos + size, tag_at
            pos += size

    def string(self, start: int, end: int) -> str:
        return bytes(self.buf[start:end]).decode("utf-8", errors="replace")

    def expect(self, wire: int, want: int, number: int, where: str, tag_at: int) -> None:
        if wire != want:
            raise self.fail(
                tag_at, f"{where} field {number} as {WIRE_NAMES[want]}, found {WIRE_NAMES.get(wire, wire)}"
            )


def signed_varint(v: int) -> int:
    """int32/int64 varints are two's complement over 64 bits."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _varints(r: WireReader, start: int, end: int, room: int | None = None) -> list[int]:
    """The packed varints in ``[start, end)``; with ``room``, at most ``room + 1`` of them: a
    caller that finds more than ``room`` refuses the field without decoding the rest."""
    out: list[int] = []
    pos = start
    while pos < end and (room is None or len(out) <= room):
        v, pos = r.varint(pos, end)
        out.append(signed_varint(v))
    return out


def _too_many_axes(r: WireReader, at: int, found: int | None = None) -> Exception:
    """``found`` None: more than allowed, not all counted."""
    return r.fail(
        at,
        f"a blob of at most {MAX_BLOB_AXES} axes (Caffe's kMaxBlobAxes), found "
        f"{f'more than {MAX_BLOB_AXES}' if found is None else found}",
    )


def _dims(r: WireReader, start: int, end: int, dims: list[int] | None = None) -> list[int]:
    """BlobShape.dim (int64), packed or not, appended to ``dims``; more than ``MAX_BLOB_AXES``
    in all are refused before they are decoded."""
    dims = [] if dims is None else dims
    for number, wire, a, b, tag_at in r.fields(start, end):
        if number == 1 and wire in (LEN, VARINT):
            dims.extend(_varints(r, a, b, MAX_BLOB_AXES - len(dims)) if wire == LEN else [signed_varint(a)])
            if len(dims) > MAX_BLOB_AXES:
                raise _too_many_axes(r, start)
        elif number == 1:
            raise r.fail(tag_at, f"BlobShape.dim as varints, found wire type {wire}")
    return dims


def count_floats(r: WireReader, wire: int, start: int, end: int, dtype: str, tag_at: int, what: str) -> int:
    """How many values a packed (LEN) or single unpacked (fixed-width) run of floats/doubles holds."""
    size = 4 if dtype == "<f4" else 8
    fixed = I32 if size == 4 else I64
    if wire not in (LEN, fixed):
        raise r.fail(tag_at, f"{what} as packed or {WIRE_NAMES[fixed]} values, found wire type {wire}")
    if (end - start) % size:
        raise r.fail(start, f"{what}: a multiple of {size} bytes, found {end - start}")
    return (end - start) // size


def read_floats(
    r: WireReader, wire: int, start: int, end: int, dtype: str, tag_at: int, what: str
) -> np.ndarray:
    """A packed (LEN) or single unpacked (fixed-width) run of floats/doubles."""
    count = count_floats(r, wire, start, end, dtype, tag_at, what)
    return np.frombuffer(r.buf, dtype=dtype, count=count, offset=start)


_VALUE_FIELDS = {5: ("<f4", "BlobProto.data"), 8: ("<f8", "BlobProto.double_data")}


def _blob(r: WireReader, start: int, end: int) -> tuple[np.ndarray, bool]:
    # Two passes: the first reads the shape and counts the values, the second copies them into
    # one array of the declared size. Keeping a view per field instead would cost ~100 bytes of
    # memory per 5-byte unpacked value before the count could be checked.
    counts = {5: 0, 8: 0}
    legacy: dict[int, int] = {}
    dims: list[int] | None = None
    for number, wire, a, b, tag_at in r.fields(start, end):
        if number in (1, 2, 3, 4):  # num, channels, height, width
            r.expect(wire, VARINT, number, "BlobProto", tag_at)
            legacy[number] = signed_varint(a)
        elif number in _VALUE_FIELDS:
            dtype, what = _VALUE_FIELDS[number]
            counts[number] += count_floats(r, wire, a, b, dtype, tag_at, what)
        elif number == 7:
            r.expect(wire, LEN, number, "BlobProto", tag_at)
            # extend in place: a file may repeat the field many times (protobuf merges them)
            dims = _dims(r, a, b, dims)
    is_legacy = bool(legacy)
    if is_legacy:  # Blob::FromProto: any legacy field -> 4-D, absent ones are 0
        shape = tuple(legacy.get(k, 0) for k in (1, 2, 3, 4))
    else:
        shape = tuple(dims or ())
    count = _blob_count(r, start, shape)
    # Blob::FromProto: double_data wins when non-empty.
    use = 8 if counts[8] else 5
    if counts[use] != count:
        raise r.fail(start, f"a blob with {count} values for shape {shape}, found {counts[use]}")
    # A copy: frombuffer views are read-only and would keep the whole file alive.
    values = np.empty(count, dtype=np.float64 if use == 8 else np.float32)
    filled = 0
    for number, wire, a, b, tag_at in r.fields(start, end):
        if number == use:
            part = read_floats(r, wire, a, b, _VALUE_FIELDS[use][0], tag_at, _VALUE_FIELDS[use][1])
            values[filled : filled + part.size] = part
            filled += part.size
    return values.reshape(shape), is_legacy


def _blob_count(r: WireReader, start: int, shape: tuple[int, ...]) -> int:
    """The number of values ``shape`` holds, checked against Caffe's blob limits.

    Counted with exact Python integers: a product in int64 wraps around, so dimensions
    multiplying to 2**64 would count as 0 values and pass for an empty blob.
    """
    if len(shape) > MAX_BLOB_AXES:
        raise _too_many_axes(r, start, len(shape))
    if any(d < 0 for d in shape):
        raise r.fail(start, f"non-negative blob dimensions, found shape {shape}")
    # The non-zero dimensions too: an empty blob of shape (0, 2**40, 2**40) holds nothing, but
    # no array (and no Caffe blob) can have that shape.
    if math.prod(d for d in shape if d) > MAX_BLOB_VALUES:
        raise r.fail(
            start,
            f"a blob of at most {MAX_BLOB_VALUES:,} values (Caffe counts them in an int), "
            f"found shape {shape}",
        )
    return math.prod(shape)


@dataclass
class _Budget:
    """What one file may still declare (``MAX_LAYERS``, ``MAX_BLOBS``), checked as entries are met."""

    layers: int = MAX_LAYERS
    blobs: int = MAX_BLOBS

    def take_layer(self, r: WireReader, at: int) -> None:
        self.layers -= 1
        if self.layers < 0:
            raise r.fail(at, f"at most {MAX_LAYERS:,} layers (sparkdp's limit; no published net comes close)")

    def take_blob(self, r: WireReader, at: int) -> None:
        self.blobs -= 1
        if self.blobs < 0:
            raise r.fail(
                at,
                f"at most {MAX_BLOBS:,} blobs in all layers (sparkdp's limit; no published net comes close)",
            )


def _layer(r: WireReader, start: int, end: int, version: str, budget: _Budget) -> CaffeLayerBlobs:
    # Field numbers of name/type/blobs in LayerParameter (V2), V1LayerParameter and V0.
    name_f, type_f, blobs_f = {"V2": (1, 2, 7), "V1": (4, 5, 6), "V0": (1, 2, 50)}[version]
    layer = CaffeLayerBlobs(name="", type="")
    v0: CaffeLayerBlobs | None = None
    for number, wire, a, b, tag_at in r.fields(start, end):
        if number == name_f:
            r.expect(wire, LEN, number, f"{version} layer name", tag_at)
            layer.name = r.string(a, b)
        elif number == type_f:
            if version == "V1":
                r.expect(wire, VARINT, number, "V1 layer type (enum)", tag_at)
                layer.type = V1_LAYER_TYPES.get(a, f"V1_LAYER_TYPE_{a}")
            else:
                r.expect(wire, LEN, number, f"{version} layer type", tag_at)
                raw = r.string(a, b)
                layer.type = _V0_LAYER_TYPES.get(raw, raw) if version == "V0" else raw
        elif number == blobs_f:
            r.expect(wire, LEN, number, f"{version} layer blobs", tag_at)
            budget.take_blob(r, tag_at)
            blob, legacy = _blob(r, a, b)
            layer.blobs.append(blob)
            layer.legacy_4d.append(legacy)
        elif number == 1 and version == "V1":  # V0 layer nested in a V1 `layers`
            r.expect(wire, LEN, number, "V0 layer", tag_at)
            v0 = _layer(r, a, b, "V0", budget)
    if v0 is not None:  # UpgradeV0Net: the V0 sub-message holds name/type/blobs
        return v0
    return layer


def decode_net(data: bytes | memoryview, source: str = "<bytes>") -> DecodedNet:
    """Decode a NetParameter's name and layer blobs.

    Raises:
        CaffemodelError: truncated/corrupt data, or both V1 and V2 layers present.
    """
    r = WireReader(data, source)
    budget = _Budget()
    name, v2, v1 = "", [], []
    inputs: list[str] = []
    input_dims: list[int] = []
    input_shapes: list[tuple[int, ...]] = []
    for number, wire, a, b, tag_at in r.fields(0, len(r.buf)):
        if number == 1:
            r.expect(wire, LEN, number, "NetParameter name", tag_at)
            name = r.string(a, b)
        elif number == 100:
            r.expect(wire, LEN, number, "NetParameter layer", tag_at)
            budget.take_layer(r, tag_at)
            v2.append(_layer(r, a, b, "V2", budget))
        elif number == 2:
            r.expect(wire, LEN, number, "NetParameter layers (V1)", tag_at)
            budget.take_layer(r, tag_at)
            v1.append((a, b))
        elif number == 3:
            r.expect(wire, LEN, number, "NetParameter input", tag_at)
            if len(inputs) == MAX_NET_INPUTS:
                raise r.fail(tag_at, f"at most {MAX_NET_INPUTS} net inputs (sparkdp's limit)")
            inputs.append(r.string(a, b))
        elif number == 4:  # input_dim: int32, packed or not
            if wire not in (LEN, VARINT):
                raise r.fail(tag_at, f"NetParameter input_dim as varints, found wire type {wire}")
            room = 4 * MAX_NET_INPUTS - len(input_dims)
            input_dims += _varints(r, a, b, room) if wire == LEN else [signed_varint(a)]
            if len(input_dims) > 4 * MAX_NET_INPUTS:
                raise r.fail(
                    tag_at,
                    f"at most {4 * MAX_NET_INPUTS} input_dim values (4 for each of at most "
                    f"{MAX_NET_INPUTS} inputs), found more",
                )
        elif number == 8:
            r.expect(wire, LEN, number, "NetParameter input_shape", tag_at)
            if len(input_shapes) == MAX_NET_INPUTS:
                raise r.fail(tag_at, f"at most {MAX_NET_INPUTS} input_shape entries (sparkdp's limit)")
            input_shapes.append(tuple(_dims(r, a, b)))
    if not input_shapes and input_dims:  # legacy: 4 dims (N, C, H, W) per input
        input_shapes = [tuple(input_dims[i : i + 4]) for i in range(0, len(input_dims), 4)]
    for shape in input_shapes:  # an input is a blob: Caffe's blob limits hold for its shape
        _blob_count(r, 0, shape)
    if v1 and v2:
        raise CaffemodelError(
            f"{source}: the file has both V1 `layers` and V2 `layer` entries; Caffe refuses such "
            "files. Re-save it with one format."
        )
    if v2:
        return DecodedNet(name, v2, "V2", inputs, input_shapes)
    layers = [_layer(r, a, b, "V1", budget) for a, b in v1]
    v0 = any(_has_v0(r, a, b) for a, b in v1)
    return DecodedNet(name, layers, "V0" if v0 else "V1", inputs, input_shapes)


def _has_v0(r: WireReader, start: int, end: int) -> bool:
    return any(n == 1 and w == LEN for n, w, *_ in r.fields(start, end))


def read_caffemodel(path: str | os.PathLike[str]) -> list[CaffeLayerBlobs]:
    """The layers (name, type, blobs) of a ``.caffemodel`` file."""
    path = os.fspath(path)
    return decode_net(read_bytes(path, ".caffemodel"), path).layers


def read_bytes(path: str, what: str) -> bytes:
    """The bytes of the file at ``path``; a ``ConfigError`` naming it (as ``what``) when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path!r}: {err.strerror or err}") from err


def read_blob_proto(path: str | os.PathLike[str]) -> np.ndarray:
    """One serialized ``BlobProto`` file (``.binaryproto``: a mean image, an InfogainLoss H)."""
    path = os.fspath(path)
    data = read_bytes(path, "BlobProto file")
    return _blob(WireReader(data, path), 0, len(data))[0]


def encode_blob_proto(array: np.ndarray) -> bytes:
    """``array`` as a serialized ``BlobProto`` (shape + float data), what :func:`read_blob_proto` reads."""
    return b"".join(_blob_chunks(np.asarray(array))[1:])  # without the enclosing LayerParameter field


# ------------------------------------------------------------------------ encoder


def varint_bytes(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def len_field(number: int, payload_len: int) -> bytes:
    return varint_bytes((number << 3) | LEN) + varint_bytes(payload_len)


def _blob_chunks(arr: np.ndarray) -> list[bytes]:
    # Fields in number order, as protobuf writes them: data (5), then shape (7).
    data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
    dims = b"".join(varint_bytes(int(d)) for d in arr.shape)
    shape = len_field(1, len(dims)) + dims if arr.ndim else b""
    body = [len_field(5, len(data)), data, len_field(7, len(shape)), shape]
    return [len_field(7, sum(len(c) for c in body)), *body]


def encode_net(layers: Iterable[CaffeLayerBlobs], name: str = "") -> bytes:
    """A V2 NetParameter, serialized.

    Each layer gets ``name``, ``type`` and ``blobs`` (``shape`` + packed float32
    ``data``); that is all ``Net::CopyTrainedLayersFrom`` reads.
    """
    return b"".join(_encode_chunks(layers, name))


def _encode_chunks(layers: Iterable[CaffeLayerBlobs], name: str) -> list[bytes]:
    # Chunks, so that a large model is written without one more full copy.
    chunks: list[bytes] = []
    if name:
        raw = name.encode()
        chunks += [len_field(1, len(raw)), raw]
    for layer in layers:
        body: list[bytes] = []
        for number, text in ((1, layer.name), (2, layer.type)):
            raw = text.encode()
            body += [len_field(number, len(raw)), raw]
        for blob in layer.blobs:
            body += _blob_chunks(np.asarray(blob))
        chunks += [len_field(100, sum(len(c) for c in body)), *body]
    return chunks


def write_caffemodel(
    handle_or_path: str | os.PathLike[str] | object, layers: Iterable[CaffeLayerBlobs], name: str = ""
) -> None:
    """Write a V2 ``.caffemodel`` to a path or an open binary file (not atomic)."""
    chunks = _encode_chunks(layers, name)
    write = getattr(handle_or_path, "write", None)
    if write is not None:  # an open binary file
        for chunk in chunks:
            write(chunk)
        return
    with open(os.fspath(cast("str | os.PathLike[str]", handle_or_path)), "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)
