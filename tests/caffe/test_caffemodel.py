"""The .caffemodel wire-format decoder/encoder against hand-built protobuf bytes."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

from sparkdp.caffe.caffemodel import (
    CaffeLayerBlobs,
    CaffemodelError,
    decode_net,
    encode_net,
    read_caffemodel,
    write_caffemodel,
)
from sparkdp.errors import ConfigError


# --- a minimal protobuf writer, independent of the module under test -----------------
def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = b""
    while True:
        byte, v = v & 0x7F, v >> 7
        out += bytes([byte | (0x80 if v else 0)])
        if not v:
            return out


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def vfield(number: int, value: int) -> bytes:
    return tag(number, 0) + varint(value)


def lfield(number: int, payload: bytes | str) -> bytes:
    payload = payload.encode() if isinstance(payload, str) else payload
    return tag(number, 2) + varint(len(payload)) + payload


def packed_floats(number: int, values) -> bytes:
    return lfield(number, struct.pack(f"<{len(values)}f", *values))


def unpacked_floats(number: int, values) -> bytes:
    return b"".join(tag(number, 5) + struct.pack("<f", v) for v in values)


def blob_v2(shape, values, *, packed=True) -> bytes:
    dims = lfield(1, b"".join(varint(d) for d in shape))
    data = packed_floats(5, values) if packed else unpacked_floats(5, values)
    return data + lfield(7, dims)


def blob_legacy(num, channels, height, width, values) -> bytes:
    return (
        vfield(1, num) + vfield(2, channels) + vfield(3, height) + vfield(4, width) + packed_floats(5, values)
    )


# ------------------------------------------------------------------------------------


def test_round_trip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3.4e38], dtype=np.float32)
    layers = [
        CaffeLayerBlobs(
            "conv1",
            "Convolution",
            [
                rng.standard_normal((20, 1, 5, 5)).astype(np.float32),
                rng.standard_normal(20).astype(np.float32),
            ],
        ),
        CaffeLayerBlobs("relu1", "ReLU", []),
        CaffeLayerBlobs(
            "odd", "Scale", [special, np.array(2.5, dtype=np.float32), np.zeros((0, 3), np.float32)]
        ),
    ]
    path = tmp_path / "m.caffemodel"
    write_caffemodel(path, layers, name="Net")
    decoded = decode_net(path.read_bytes())
    assert decoded.name == "Net" and decoded.version == "V2"
    assert [(d.name, d.type) for d in decoded.layers] == [(x.name, x.type) for x in layers]
    for want, got in zip(layers, decoded.layers, strict=True):
        assert len(got.blobs) == len(want.blobs) and got.legacy_4d == [False] * len(want.blobs)
        for a, b in zip(want.blobs, got.blobs, strict=True):
            assert b.dtype == np.float32 and b.shape == a.shape
            assert a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes()
    assert [x.name for x in read_caffemodel(path)] == ["conv1", "relu1", "odd"]
    assert encode_net(layers, "Net") == path.read_bytes()


def test_v2_variants_unpacked_double_and_skipped_fields():
    layer = (
        lfield(1, "ip")
        + lfield(2, "InnerProduct")
        + lfield(3, "data")
        + lfield(4, "ip")
        + tag(5, 5)
        + struct.pack("<f", 1.0)  # loss_weight (fixed32): skipped
        + vfield(10, 1)  # phase: skipped
        + lfield(117, vfield(1, 2))  # inner_product_param: skipped
        + lfield(7, blob_v2((2, 2), [1, 2, 3, 4], packed=False))
        # double_data (8) wins over data; dims given unpacked.
        + lfield(7, lfield(8, struct.pack("<3d", 0.5, 1.5, 2.5)) + lfield(7, vfield(1, 3)))
    )
    dims = vfield(4, 1) + vfield(4, 3) + lfield(4, varint(8) + varint(8))  # unpacked and packed input_dim
    data = lfield(1, "net") + lfield(3, "data") + dims + lfield(100, layer) + tag(9, 1) + b"\0" * 8
    net = decode_net(data)
    assert net.inputs == ["data"] and net.input_shapes == [(1, 3, 8, 8)]
    (got,) = net.layers
    np.testing.assert_array_equal(got.blobs[0], [[1, 2], [3, 4]])
    assert got.blobs[1].dtype == np.float64
    np.testing.assert_array_equal(got.blobs[1], [0.5, 1.5, 2.5])


def test_hand_built_v1_file_with_enum_types_and_legacy_shapes():
    w = np.arange(12, dtype=np.float32)
    conv = (
        vfield(5, 4)
        + lfield(4, "conv1")
        + lfield(2, "data")
        + lfield(3, "conv1")
        + lfield(6, blob_legacy(2, 1, 2, 3, w))
        + lfield(6, blob_legacy(1, 1, 1, 2, [0.5, -0.5]))
    )
    conv += packed_floats(7, [1.0, 2.0])  # blobs_lr: skipped
    ip = (
        lfield(4, "ip1")
        + vfield(5, 14)
        + lfield(6, blob_legacy(1, 1, 3, 4, w))
        + lfield(6, blob_legacy(1, 1, 1, 3, [1, 2, 3]))
    )
    relu = lfield(4, "relu1") + vfield(5, 18)
    loss = lfield(4, "loss") + vfield(5, 21)
    data = lfield(1, "LeNet") + b"".join(lfield(2, x) for x in (conv, ip, relu, loss))
    net = decode_net(data)
    assert net.version == "V1"
    assert [(x.name, x.type) for x in net.layers] == [
        ("conv1", "Convolution"),
        ("ip1", "InnerProduct"),
        ("relu1", "ReLU"),
        ("loss", "SoftmaxWithLoss"),
    ]
    assert [b.shape for b in net.layers[0].blobs] == [(2, 1, 2, 3), (1, 1, 1, 2)]
    assert [b.shape for b in net.layers[1].blobs] == [(1, 1, 3, 4), (1, 1, 1, 3)]
    assert net.layers[1].legacy_4d == [True, True]
    np.testing.assert_array_equal(net.layers[1].blobs[0].ravel(), w)


def test_v0_layers_nested_in_v1():
    v0 = lfield(1, "conv1") + lfield(2, "conv") + lfield(50, blob_legacy(1, 1, 1, 2, [3.0, 4.0]))
    data = lfield(2, lfield(1, v0) + lfield(2, "data"))
    net = decode_net(data + lfield(3, "x") + lfield(8, lfield(1, varint(2) + varint(5))))
    assert net.version == "V0" and net.inputs == ["x"] and net.input_shapes == [(2, 5)]
    (layer,) = net.layers
    assert (layer.name, layer.type, layer.blobs[0].shape) == ("conv1", "Convolution", (1, 1, 1, 2))


def test_truncated_file_raises_a_clear_error_at_every_cut():
    data = encode_net(
        [CaffeLayerBlobs("ip", "InnerProduct", [np.ones((3, 4), np.float32), np.ones(3, np.float32)])]
    )
    for cut in range(1, len(data)):
        try:
            decode_net(data[:cut], "x.caffemodel")
        except CaffemodelError as err:
            assert "byte offset" in str(err) and "expected" in str(err)
    with pytest.raises(
        CaffemodelError, match=r"x.caffemodel: truncated or corrupt .caffemodel at byte offset \d+"
    ):
        decode_net(data[:-5], "x.caffemodel")


def test_random_corruption_never_escapes_as_another_exception():
    rng = np.random.default_rng(1)
    data = bytearray(encode_net([CaffeLayerBlobs("c", "Convolution", [np.ones((2, 3), np.float32)])]))
    for _ in range(500):
        bad = bytearray(data)
        for i in rng.integers(0, len(bad), size=3):
            bad[i] = int(rng.integers(0, 256))
        try:
            decode_net(bytes(bad))
        except CaffemodelError:
            pass


@pytest.mark.parametrize(
    "data, message",
    [
        (lfield(100, lfield(1, "a")) + lfield(2, lfield(4, "b")), "both V1 `layers` and V2 `layer`"),
        (lfield(100, lfield(7, blob_v2((2, 3), [1, 2, 3]))), "6 values for shape"),
        (lfield(100, vfield(1, 5)), "V2 layer name field 1 as length-delimited, found varint"),
        (tag(100, 3), "wire type 0, 1, 2 or 5"),
        (lfield(100, lfield(7, lfield(5, b"\0\0\0"))), "multiple of 4 bytes"),
        (b"\x08" + b"\xff" * 11, "varint of at most 10 bytes"),
        (b"name: 'LeNet'", "expected"),
    ],
)
def test_corrupt_inputs(data, message):
    with pytest.raises(CaffemodelError, match=message):
        decode_net(data)


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read .caffemodel"):
        read_caffemodel("/no/such/file.caffemodel")


def test_large_file_decodes_fast():
    big = [CaffeLayerBlobs(f"l{i}", "InnerProduct", [np.ones((1000, 2500), np.float32)]) for i in range(5)]
    data = encode_net(big)  # 50 MB
    start = time.perf_counter()
    net = decode_net(data)
    elapsed = time.perf_counter() - start
    assert len(net.layers) == 5 and net.layers[4].blobs[0].shape == (1000, 2500)
    assert elapsed < 1.0, f"decoding 50 MB took {elapsed:.2f}s"


def _one_blob_net(blob: bytes) -> bytes:
    return lfield(100, lfield(1, "ip") + lfield(7, blob))


@pytest.mark.parametrize(
    "blob, message",
    [
        # 2**32 * 2**32 = 2**64: an int64 product wraps to 0 and passed for an empty blob
        (
            blob_v2((1 << 32, 1 << 32), []),
            r"at most 2,147,483,647 values .* found shape \(4294967296, 4294967296\)",
        ),
        # 3 * 6148914691236517206 = 2**64 + 2: wrapped to 2, the number of values given
        (blob_v2((3, 6148914691236517206), [1, 2]), "at most 2,147,483,647 values"),
        # an empty blob still needs a shape an array can have
        (blob_v2((0, 1 << 40, 1 << 40), []), "at most 2,147,483,647 values"),
        (blob_legacy(1 << 20, 1 << 20, 1 << 20, 0, []), "at most 2,147,483,647 values"),
        (blob_v2((1,) * 33, [1]), "at most 32 axes"),
        (blob_v2((1,) * 70, [1]), r"at most 32 axes .*, found more than 32"),
    ],
    ids=["wraps-to-0", "wraps-to-2", "empty-but-huge", "legacy-empty-but-huge", "33-axes", "70-axes"],
)
def test_crafted_blob_shapes_raise_caffemodel_error(blob, message):
    with pytest.raises(CaffemodelError, match=message):
        decode_net(_one_blob_net(blob), "x.caffemodel")


def test_a_dimension_varint_with_bits_beyond_64_is_cut_to_64_bits():
    """A 10-byte varint can carry 70 bits; protobuf keeps the low 64 (here: int64 -1)."""
    dims = lfield(1, b"\xff" * 9 + b"\x7f")
    with pytest.raises(CaffemodelError, match=r"non-negative blob dimensions, found shape \(-1,\)"):
        decode_net(_one_blob_net(packed_floats(5, [1.0]) + lfield(7, dims)))
    big = lfield(1, b"\x80" * 9 + b"\x7e" + varint(1))  # 2**69 + 2**70: nothing left in 64 bits -> 0
    assert decode_net(_one_blob_net(lfield(7, big))).layers[0].blobs[0].shape == (0, 1)


@pytest.mark.timeout(120)
def test_many_repeated_shape_fields_decode_in_linear_time():
    """BlobProto.shape repeated 100,000 times (protobuf merges them): a list copied per field was quadratic."""
    data = _one_blob_net(packed_floats(5, [1.0]) + lfield(7, lfield(1, varint(1))) * 100_000)
    start = time.perf_counter()
    with pytest.raises(CaffemodelError, match=r"at most 32 axes .*, found more than 32"):
        decode_net(data)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"decoding 100,000 shape fields took {elapsed:.1f} s"


def _refused_within(
    data, message: str, *, peak_mib: float | None, seconds: float = 10.0, read=decode_net
) -> None:
    """``read(data)`` raises a CaffemodelError matching ``message``, allocating at most ``peak_mib``
    MiB on the way (the input is allocated before the count starts; None: not traced, which is
    slow per object) and within ``seconds``."""
    import tracemalloc

    if peak_mib is not None:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CaffemodelError, match=message):
            read(data)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert peak_mib is None or peak < peak_mib, (
        f"{peak:.1f} MiB allocated before refusing {len(data) / 2**20:.1f} MiB"
    )
    assert elapsed < seconds, f"{elapsed:.1f} s before refusing {len(data) / 2**20:.1f} MiB"


_MANY = 4 << 20  # 4 MiB of one-byte varints: 4 million values declared


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "data, message",
    [
        (_one_blob_net(lfield(7, lfield(1, b"\x01" * _MANY))), "at most 32 axes .*, found more than 32"),
        (lfield(3, "data") + lfield(4, b"\x01" * _MANY), "at most 4096 input_dim values"),
        (lfield(3, "data") + lfield(8, lfield(1, b"\x01" * _MANY)), "at most 32 axes"),
        (
            lfield(3, "data") + lfield(8, b"".join(lfield(1, varint(1)) for _ in range(100_000))),
            "at most 32 axes",
        ),
        # 1 declared value, 100,000 given one by one: refused by count, without a view per value
        (
            _one_blob_net(blob_v2((1,), [0.5] * 100_000, packed=False)),
            "a blob with 1 values for shape \\(1,\\), found 100000",
        ),
        (lfield(8, b"") * 2000, "at most 1024 input_shape entries"),
    ],
    ids=[
        "blob-dims",
        "input-dim",
        "input-shape-dims",
        "input-shape-repeated",
        "unpacked-values",
        "input-shapes",
    ],
)
def test_declared_sizes_are_checked_before_lists_are_built(data, message):
    _refused_within(data, message, peak_mib=4)


@pytest.mark.parametrize(
    "dims, message",
    [
        ((1 << 40, 1 << 40, 1, 1), "at most 2,147,483,647 values"),
        ((1, -3, 2, 2), "non-negative blob dimensions"),
    ],
)
def test_input_shapes_are_held_to_the_blob_limits(dims, message):
    shape = lfield(8, lfield(1, b"".join(varint(d) for d in dims)))
    legacy = b"".join(vfield(4, d) for d in dims)
    for data in (lfield(3, "data") + shape, lfield(3, "data") + legacy):
        with pytest.raises(CaffemodelError, match=message):
            decode_net(data)
    assert decode_net(lfield(3, "data") + b"".join(vfield(4, d) for d in (2, 3, 4, 5))).input_shapes == [
        (2, 3, 4, 5)
    ]


@pytest.mark.timeout(60)
def test_files_of_tiny_empty_entries_are_refused_before_millions_of_objects():
    """An empty layer costs 3 bytes of file and ~300 bytes of memory; an empty blob 2 and ~100."""
    _refused_within(lfield(100, b"") * 200_000, "at most 100,000 layers", peak_mib=None, seconds=30)
    empty_blob = lfield(7, lfield(7, lfield(1, varint(0))))  # shape (0,)
    _refused_within(lfield(100, empty_blob * 300_000), "at most 200,000 blobs", peak_mib=None, seconds=30)
    _refused_within(lfield(3, "") * 2000, "at most 1024 net inputs", peak_mib=1)


@pytest.mark.timeout(60)
def test_a_binaryproto_declaring_too_many_axes_is_refused_fast(tmp_path):
    from sparkdp.caffe.caffemodel import read_blob_proto

    path = tmp_path / "mean.binaryproto"
    path.write_bytes(lfield(7, lfield(1, b"\x01" * _MANY)))
    _refused_within(str(path), "at most 32 axes", peak_mib=4 + _MANY / 2**20, read=read_blob_proto)
