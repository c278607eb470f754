"""Caffe's ``Datum`` record (one image + label in an LMDB/LevelDB), decoded and encoded without protobuf.

A Caffe ``Data`` layer reads serialized ``Datum`` messages from its database
(``caffe.proto``: 1 ``channels``, 2 ``height``, 3 ``width`` int32; 4 ``data`` bytes, the
C×H×W uint8 pixels; 5 ``label`` int32; 6 ``float_data`` repeated float; 7 ``encoded``
bool, set when ``data`` holds a whole JPEG/PNG file).  sparkdp trains from those
databases where they live (``caffe/sources/``), so it needs this decoder on every
worker.  Rather than adding a protobuf dependency it reads the wire format the way
``caffe/caffemodel.py`` does, with its :class:`~sparkdp.caffe.caffemodel.WireReader`
(bounds-checked varints and length-delimited fields over one buffer, errors with the byte
offset).  A Datum is five to seven fields, and the pixels are taken with one ``numpy.frombuffer``.

What follows Caffe exactly:

* ``data`` wins over ``float_data`` when non-empty (``DataTransformer::Transform`` checks
  ``data.size() > 0``); the values are laid out C×H×W.
* ``float_data`` is accepted packed and unpacked (``caffe.proto`` is proto2, so Caffe
  itself writes it unpacked: one tag per float; runs of them are read with one numpy view).
* ``encoded`` images are decoded like OpenCV's ``imdecode(..., IMREAD_UNCHANGED)``
  (``DecodeDatumToCVMatNative``): grey images give 1 channel, colour ones 3 channels in
  **BGR** order, images with alpha 4 (BGRA); ``force_color``/``force_gray`` (from
  ``transform_param``) convert to 3/1 channels.  Pillow does the decoding, so JPEG pixels
  can differ from OpenCV's by the decoders' rounding (PNG is exact); only 8-bit images are
  accepted, as Caffe's ``CHECK(cv_img.depth() == CV_8U)``.

:func:`encode_datum` writes what Caffe's tools write (``convert_mnist_data``,
``convert_imageset``): uint8 pixels as ``data``, float arrays as unpacked ``float_data``,
or an encoded PNG/JPEG with ``encoded: true`` and no dimensions.

Example:
    >>> import numpy as np
    >>> record = encode_datum(np.arange(6, dtype=np.uint8).reshape(1, 2, 3), label=7)
    >>> array, label = decode_datum(record)
    >>> array.shape, int(array[0, 1, 2]), label
    ((1, 2, 3), 5, 7)
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from .caffemodel import I32, LEN, VARINT, WireReader, len_field, read_floats, signed_varint, varint_bytes

__all__ = [
    "MAX_IMAGE_PIXELS",
    "Datum",
    "datum_array",
    "decode_datum",
    "encode_datum",
    "encoded_size",
    "parse_datum",
]

#: The most pixels (height × width) an encoded image may declare. Its header is read first and a
#: larger image is refused before it is decoded: Pillow's own bomb check only starts at ~179 Mpx
#: (a 160 KiB PNG of one colour can decode to hundreds of MiB below that). 2^24 is 4096×4096,
#: far above what Caffe nets train on; raise it here for larger images. A source checks every
#: record after the first against the net's input size, read from the header too.
MAX_IMAGE_PIXELS = 1 << 24


@dataclass
class Datum:
    """The fields of one serialized ``Datum`` (``data`` is a read-only view into the record)."""

    channels: int = 0
    height: int = 0
    width: int = 0
    data: bytes | memoryview = b""
    label: int = 0
    float_data: np.ndarray | None = None
    encoded: bool = False

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.height, self.width)


def _reader(record: bytes | memoryview, source: str) -> WireReader:
    def error(offset: int, expected: str) -> DataError:
        return DataError(
            f"{source}: truncated or corrupt Caffe Datum at byte offset {offset}: expected {expected}. "
            "Is this a database of serialized Datum records (as convert_imageset/convert_mnist_data "
            "write them)?"
        )

    return WireReader(record, source, error)


def _int32(r: WireReader, value: int, tag_at: int, what: str) -> int:
    v = signed_varint(value)
    if not -(1 << 31) <= v < 1 << 31:
        raise r.fail(tag_at, f"{what} as an int32, found {v}")
    return v


def _unpacked_floats(r: WireReader, pos: int, end: int) -> tuple[np.ndarray, int]:
    """A run of unpacked ``float_data`` fields (tag 0x35 + 4 bytes each) starting at ``pos``."""
    count = (end - pos) // 5
    rows = np.frombuffer(r.buf, dtype=np.uint8, count=count * 5, offset=pos).reshape(count, 5)
    tags = rows[:, 0] == 0x35
    run = count if tags.all() else int(np.argmin(tags))  # >= 1: the caller checked the first one
    return np.ascontiguousarray(rows[:run, 1:]).view("<f4").reshape(run), pos + run * 5


def parse_datum(record: bytes | memoryview, source: str = "<Datum>") -> Datum:
    """The fields of one serialized Datum; unknown fields are skipped as protobuf does.

    Raises:
        DataError: truncated or corrupt bytes, or a known field with the wrong wire type
            (naming ``source`` and the byte offset).
    """
    r = _reader(record, source)
    datum = Datum()
    floats: list[np.ndarray] = []
    pos, end = 0, len(r.buf)
    while pos < end:
        for number, wire, a, b, tag_at in r.fields(pos, end):
            if number == 6 and wire == I32 and a == tag_at + 1:
                # the usual one-byte tag: take the whole run of unpacked floats at once, then read on after it
                run, pos = _unpacked_floats(r, tag_at, end)
                floats.append(run)
                break
            if number in (1, 2, 3, 5) and wire == VARINT:
                name = ("channels", "height", "width", "", "label")[number - 1]
                setattr(datum, name, _int32(r, a, tag_at, f"Datum.{name}"))
            elif number == 7 and wire == VARINT:
                datum.encoded = bool(a)
            elif number == 4 and wire == LEN:
                datum.data = r.buf[a:b]
            elif number == 6 and wire in (LEN, I32):
                floats.append(read_floats(r, wire, a, b, "<f4", tag_at, "packed Datum.float_data"))
            elif (
                1 <= number <= 7
            ):  # a known field with the wrong wire type; float_data never takes 64-bit values
                r.expect(wire, {4: LEN, 6: I32}.get(number, VARINT), number, "Datum", tag_at)
        else:
            break
    if floats:
        datum.float_data = floats[0] if len(floats) == 1 else np.concatenate(floats)
    return datum


def encoded_size(datum: Datum, source: str = "<Datum>") -> tuple[int, int]:
    """``(height, width)`` of an encoded Datum's image, from its header alone (nothing is decoded)."""
    with _opened(datum.data, source) as img:
        return img.height, img.width


@contextmanager
def _opened(data: bytes | memoryview, source: str) -> Iterator[Any]:
    """The image in ``data`` opened lazily (header read, pixels not yet decoded); Pillow's errors as DataError."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(bytes(data))) as img:
            yield img
    except Image.DecompressionBombError as exc:
        # a few bytes of header can declare billions of pixels; Pillow refuses to allocate them
        raise DataError(
            f"{source}: the Datum's encoded image declares more pixels than Pillow will decode ({exc}); "
            "is the record damaged?"
        ) from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(
            f"{source}: the Datum is marked encoded but its data is not a readable image ({exc}); "
            "encoded Datums hold a whole JPEG or PNG file."
        ) from exc


def _image(data: bytes | memoryview, color: bool | None, source: str) -> np.ndarray:
    """An encoded image as C×H×W uint8, channels as OpenCV orders them (BGR/BGRA)."""
    with _opened(data, source) as img:
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise DataError(
                f"{source}: the Datum's encoded image is {img.width}×{img.height} pixels, more than "
                f"sparkdp.caffe.datum.MAX_IMAGE_PIXELS ({MAX_IMAGE_PIXELS:,}); refused before decoding. Store "
                "smaller images (convert_imageset --resize_height/--resize_width), or raise that limit."
            )
        img.load()
        mode = img.mode
        if color is True:
            img = img.convert("RGB")
        elif color is False:
            img = img.convert("L")
        elif mode in ("1", "L"):
            img = img.convert("L")
        elif mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in img.info):
            img = img.convert("RGBA")
        elif mode in ("RGB", "P", "CMYK", "YCbCr", "LAB", "HSV"):
            img = img.convert("RGB")
        else:
            raise DataError(
                f"{source}: encoded image of mode {mode!r}; Caffe's Data layer takes 8-bit images only "
                "(CV_8U): store 8-bit grey or colour JPEG/PNG files."
            )
        arr = np.asarray(img)
    if arr.ndim == 2:
        return arr[None]
    if arr.shape[2] == 3:
        arr = arr[:, :, ::-1]  # RGB -> BGR
    elif arr.shape[2] == 4:
        arr = arr[:, :, [2, 1, 0, 3]]  # RGBA -> BGRA
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def datum_array(datum: Datum, *, color: bool | None = None, source: str = "<Datum>") -> np.ndarray:
    """The Datum's values as a C×H×W array: uint8 for ``data``/encoded images, float32 for ``float_data``.

    Args:
        color: for encoded images: None keeps the file's own channels (Caffe's default),
            True forces 3 (BGR), False 1 (``transform_param`` ``force_color``/``force_gray``).
    """
    if datum.encoded:
        return _image(datum.data, color, source)
    shape = datum.shape
    count = shape[0] * shape[1] * shape[2]
    if min(shape) <= 0:
        raise DataError(
            f"{source}: Datum has channels×height×width {shape[0]}×{shape[1]}×{shape[2]}; a raw (not encoded) "
            "Datum needs all three > 0."
        )
    if len(datum.data):
        if len(datum.data) != count:
            raise DataError(
                f"{source}: Datum data has {len(datum.data)} bytes but channels×height×width "
                f"{shape[0]}×{shape[1]}×{shape[2]} needs {count}."
            )
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape)
    values = datum.float_data
    if values is None or values.size != count:
        found = 0 if values is None else values.size
        raise DataError(
            f"{source}: Datum has no data bytes and {found} float_data values, but channels×height×width "
            f"{shape[0]}×{shape[1]}×{shape[2]} needs {count}."
        )
    return values.astype(np.float32, copy=False).reshape(shape)


def decode_datum(
    record: bytes | memoryview, *, color: bool | None = None, source: str = "<Datum>"
) -> tuple[np.ndarray, int]:
    """``(C×H×W array, label)`` of one serialized Datum (see :func:`datum_array`)."""
    datum = parse_datum(record, source)
    return datum_array(datum, color=color, source=source), datum.label


def encode_datum(array: np.ndarray, label: int = 0, *, encoding: str | None = None) -> bytes:
    """One serialized Datum, as Caffe's tools write it.

    Args:
        array: C×H×W (or H×W, one channel) values; uint8 becomes ``data``, any float type
            ``float_data`` (float32).  Colour channels are in Caffe's BGR order.
        label: the int32 label.
        encoding: ``"png"`` or ``"jpg"``/``"jpeg"``: store the (uint8, 1/3/4-channel) image as a
            file of that format with ``encoded: true``, like ``convert_imageset --encoded``.
    """
    arr = np.asarray(array)
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3:
        raise DataError(f"encode_datum takes a C×H×W (or H×W) array; got shape {arr.shape}.")
    # fields in number order: dimensions 1-3 and data 4 before the label 5, float_data 6 / encoded 7 after it
    dims = b"".join(
        varint_bytes(number << 3) + varint_bytes(int(value)) for number, value in zip((1, 2, 3), arr.shape)
    )
    if encoding is not None:
        before, after = _field_bytes(4, _encode_image(arr, encoding)), varint_bytes(7 << 3) + varint_bytes(1)
    elif arr.dtype == np.uint8:
        before, after = dims + _field_bytes(4, np.ascontiguousarray(arr).tobytes()), b""
    elif np.issubdtype(arr.dtype, np.floating):
        flat = np.ascontiguousarray(arr, dtype="<f4").reshape(-1)
        rows = np.empty((flat.size, 5), dtype=np.uint8)  # unpacked: tag (6 << 3 | 5) + 4 bytes per float
        rows[:, 0] = (6 << 3) | I32
        rows[:, 1:] = flat.view(np.uint8).reshape(-1, 4)
        before, after = dims, rows.tobytes()
    else:
        raise DataError(f"encode_datum stores uint8 pixels or floats; got dtype {arr.dtype}.")
    return before + varint_bytes(5 << 3) + varint_bytes(int(label)) + after


def _field_bytes(number: int, payload: bytes) -> bytes:
    return len_field(number, len(payload)) + payload


def _encode_image(arr: np.ndarray, encoding: str) -> bytes:
    from PIL import Image

    fmt = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG"}.get(encoding.lower())
    if fmt is None:
        raise DataError(f"encoding {encoding!r} is not supported; use 'png' (lossless) or 'jpg'.")
    if arr.dtype != np.uint8 or arr.shape[0] not in (1, 3, 4):
        raise DataError(
            f"an encoded Datum holds an 8-bit image of 1, 3 or 4 channels; got {arr.shape[0]} channel(s) "
            f"of {arr.dtype}."
        )
    if arr.shape[0] == 1:
        img = Image.fromarray(np.ascontiguousarray(arr[0]), "L")
    else:
        order = [2, 1, 0] if arr.shape[0] == 3 else [2, 1, 0, 3]  # BGR(A) -> RGB(A)
        hwc = np.ascontiguousarray(arr[order].transpose(1, 2, 0))
        img = Image.fromarray(hwc, "RGB" if arr.shape[0] == 3 else "RGBA")
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()
