"""Caffe Datum records, transform_param and the net's own LMDB/LevelDB/HDF5 sources (caffe/sources/).

The Datum checks decode protobuf bytes written out by hand here (an independent reference
for the field numbers and wire types of caffe.proto's ``Datum``); the transform checks use
numbers worked out by hand from Caffe's ``DataTransformer::Transform``.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from sparkdp.caffe.caffemodel import encode_blob_proto
from sparkdp.caffe.datum import decode_datum, encode_datum, parse_datum
from sparkdp.caffe.sources import (
    DatumDBSource,
    DatumTransform,
    HDF5Source,
    net_data,
    write_datum_db,
    write_hdf5_source,
)
from sparkdp.caffe.spec import load_net_spec
from sparkdp.errors import ConfigError, DataError

lmdb = pytest.importorskip("lmdb")
h5py = pytest.importorskip("h5py")

EXAMPLES = Path(__file__).parent / "data"


# ----------------------------------------------------------------------------- Datum


def test_datum_decodes_hand_written_bytes_field_by_field():
    pixels = bytes([0, 1, 2, 250, 251, 255])
    record = (
        b"\x08\x01"  # 1 channels = 1 (varint)
        + b"\x10\x02"  # 2 height = 2
        + b"\x18\x03"  # 3 width = 3
        + b"\x22\x06"
        + pixels  # 4 data: length-delimited, 6 bytes
        + b"\x28\x07"  # 5 label = 7
    )
    datum = parse_datum(record)
    assert (datum.channels, datum.height, datum.width, datum.label, datum.encoded) == (1, 2, 3, 7, False)
    assert bytes(datum.data) == pixels and datum.float_data is None
    array, label = decode_datum(record)
    assert array.dtype == np.uint8 and array.shape == (1, 2, 3) and label == 7
    assert array.tolist() == [[[0, 1, 2], [250, 251, 255]]]
    # the encoder writes exactly these bytes (convert_mnist_data's fields, in field-number order)
    assert encode_datum(np.frombuffer(pixels, np.uint8).reshape(1, 2, 3), 7) == record
    # a negative int32 label is a 10-byte two's-complement varint; unknown fields are skipped
    negative = record[:-2] + b"\x28" + b"\xff" * 9 + b"\x01" + b"\xc8\x06\x05" + b"\x9a\x06\x02ab"
    assert decode_datum(negative)[1] == -1
    assert encode_datum(array, -1) == record[:-2] + b"\x28" + b"\xff" * 9 + b"\x01"


def test_datum_float_data_packed_and_unpacked():
    head = b"\x08\x01\x10\x01\x18\x03\x28\x02"  # 1×1×3, label 2
    values = np.array([0.5, -2.0, 3.25], dtype="<f4")
    packed = head + b"\x32\x0c" + values.tobytes()  # 6 float_data, packed (wire type 2, 12 bytes)
    unpacked = head + b"".join(b"\x35" + v.tobytes() for v in values)  # one tag (wire type 5) per float
    for record in (packed, unpacked):
        array, label = decode_datum(record)
        assert array.dtype == np.float32 and array.tolist() == [[[0.5, -2.0, 3.25]]] and label == 2
    # Caffe (proto2, not packed) writes float_data unpacked: so does encode_datum
    assert encode_datum(values.reshape(1, 1, 3), 2) == head[:6] + b"\x28\x02" + unpacked[len(head) :]
    # data wins over float_data when both are present (DataTransformer checks data.size() > 0)
    both = head + b"\x22\x03\x09\x08\x07" + b"\x32\x0c" + values.tobytes()
    assert decode_datum(both)[0].tolist() == [[[9, 8, 7]]]


def test_encoded_png_is_exact_and_colour_comes_out_bgr():
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(buf, format="PNG")
    png = buf.getvalue()
    record = (
        b"\x22" + bytes([len(png) & 0x7F | 0x80, len(png) >> 7]) + png + b"\x28\x03\x38\x01"
    )  # 4, 5, 7: true
    array, label = decode_datum(record)
    assert label == 3 and array.shape == (3, 5, 7)
    assert np.array_equal(array, rgb[:, :, ::-1].transpose(2, 0, 1))  # C×H×W, B first as OpenCV
    # force_gray / force_color (transform_param) convert like cv::imdecode with a colour flag
    assert decode_datum(record, color=False)[0].shape == (1, 5, 7)
    bgr = array
    again = decode_datum(encode_datum(bgr, 3, encoding="png"))[0]
    assert np.array_equal(again, bgr)
    grey = rng.integers(0, 256, (1, 6, 4), dtype=np.uint8)
    assert np.array_equal(decode_datum(encode_datum(grey, 0, encoding="png"))[0], grey)
    forced = decode_datum(encode_datum(grey, 0, encoding="png"), color=True)[0]
    assert forced.shape == (3, 6, 4) and all(np.array_equal(forced[c], grey[0]) for c in range(3))


def test_encoded_jpeg_decodes_close_to_the_original():
    yy, xx = np.mgrid[0:16, 0:16]
    smooth = np.stack([yy * 8, xx * 8, (yy + xx) * 4]).astype(np.uint8)  # B, G, R planes
    array, label = decode_datum(encode_datum(smooth, 9, encoding="jpg"))
    assert array.shape == (3, 16, 16) and label == 9
    assert np.abs(array.astype(int) - smooth).mean() < 4  # lossy, but the channels stay in place


def test_corrupt_datums_are_data_errors():
    with pytest.raises(DataError, match="byte offset 6: expected 6 bytes of field 4"):
        parse_datum(b"\x08\x01\x10\x02\x22\x06\x00\x01")
    with pytest.raises(DataError, match="6 bytes but channels×height×width 1×2×2 needs 4"):
        decode_datum(b"\x08\x01\x10\x02\x18\x02\x22\x06" + bytes(6))
    with pytest.raises(DataError, match="not a readable image"):
        decode_datum(b"\x22\x03abc\x38\x01")
    with pytest.raises(DataError, match="Datum field 5 as varint"):
        parse_datum(b"\x2a\x01\x00")
    with pytest.raises(DataError, match="Datum field 6 as 32-bit, found 64-bit"):
        parse_datum(b"\x31" + bytes(8))  # float_data with a double's wire type


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_an_encoded_image_declaring_billions_of_pixels_is_a_data_error():
    """A 60-byte PNG header can declare 100,000 x 100,000 pixels: Pillow's own error escaped."""
    png = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0))
        + _png_chunk(b"IDAT", zlib.compress(b""))
        + _png_chunk(b"IEND", b"")
    )
    record = b"\x22" + bytes([len(png)]) + png + b"\x38\x01"
    with pytest.raises(DataError, match="declares more pixels than Pillow will decode"):
        decode_datum(record)


# ------------------------------------------------------------------------- transform

X = np.array(
    [[100, 101, 102, 103], [104, 105, 106, 107], [108, 109, 110, 111], [112, 113, 114, 115]], np.uint8
)
MEAN = np.array([[0, 1, 2, 3], [10, 12, 14, 16], [20, 23, 26, 29], [30, 34, 38, 42]], np.float32)


def _layer(tmp_path: Path, transform: str, phase: str = "TRAIN"):
    text = (
        f'layer {{ name: "d" type: "Data" top: "data" top: "label" include {{ phase: {phase} }} '
        f'transform_param {{ {transform} }} data_param {{ source: "db" batch_size: 4 }} }}'
    )
    return load_net_spec(text).layers[0]


def test_mean_file_is_indexed_at_the_centre_crop_in_test(tmp_path):
    (tmp_path / "mean.binaryproto").write_bytes(encode_blob_proto(MEAN.reshape(1, 1, 4, 4)))
    layer = _layer(tmp_path, 'mean_file: "mean.binaryproto" crop_size: 2 scale: 0.5', "TEST")
    t = DatumTransform.from_layer(layer, "TEST", [tmp_path])  # relative to the prototxt's directory
    assert t.mean_file == str((tmp_path / "mean.binaryproto").resolve())
    out = t(X.reshape(1, 1, 4, 4), np.random.default_rng(0))
    # centre offset (1, 1): pixels 105 106 / 109 110 minus mean 12 14 / 23 26 (not 0 1 / 10 12), times 0.5
    assert out.dtype == np.float32 and out.tolist() == [[[[46.5, 46.0], [43.0, 42.0]]]]
    t.check((1, 4, 4), "here")
    with pytest.raises(DataError, match="mean_file .* is 1×4×4 but the records are 1×5×5"):
        t.check((1, 5, 5), "here")


def test_random_crops_and_mirror_in_train_cover_every_offset(tmp_path):
    (tmp_path / "mean.binaryproto").write_bytes(encode_blob_proto(MEAN.reshape(1, 1, 4, 4)))
    layer = _layer(tmp_path, 'mean_file: "mean.binaryproto" crop_size: 2 mirror: true', "TRAIN")
    t = DatumTransform.from_layer(layer, "TRAIN", [tmp_path])
    diff = X.astype(np.float32) - MEAN
    allowed = {}
    for h in range(3):
        for w in range(3):
            crop = diff[h : h + 2, w : w + 2]
            allowed[crop.tobytes()] = (h, w, False)
            allowed[crop[:, ::-1].copy().tobytes()] = (h, w, True)
    out = t(np.repeat(X.reshape(1, 1, 4, 4), 200, axis=0), np.random.default_rng(1))
    seen = {allowed[o[0].tobytes()] for o in out}  # KeyError: a crop Caffe could not produce
    assert len(seen) == 18  # all 9 offsets, flipped and not
    again = t(np.repeat(X.reshape(1, 1, 4, 4), 200, axis=0), np.random.default_rng(1))
    assert np.array_equal(out, again)  # seeded: reproducible


def test_mirror_mean_values_and_scale_without_crop(tmp_path):
    layer = _layer(tmp_path, "mirror: true mean_value: 1 mean_value: 2 mean_value: 3 scale: 2")
    t = DatumTransform.from_layer(layer, "TRAIN")
    x = np.arange(3 * 1 * 3, dtype=np.uint8).reshape(1, 3, 1, 3)  # channels [0 1 2] [3 4 5] [6 7 8]
    plain = [[[[-2.0, 0.0, 2.0]], [[2.0, 4.0, 6.0]], [[6.0, 8.0, 10.0]]]]
    flipped = [[[[2.0, 0.0, -2.0]], [[6.0, 4.0, 2.0]], [[10.0, 8.0, 6.0]]]]
    outs = [t(x, np.random.default_rng(s)).tolist() for s in range(20)]
    assert all(o in (plain, flipped) for o in outs) and plain in outs and flipped in outs
    one = DatumTransform.from_layer(_layer(tmp_path, "mean_value: 100 scale: 0.5"), "TEST")
    assert one(X.reshape(1, 1, 4, 4), np.random.default_rng(0))[0, 0, 0].tolist() == [0.0, 0.5, 1.0, 1.5]


def test_transform_errors_follow_caffes_checks(tmp_path):
    with pytest.raises(ConfigError, match="both mean_file and mean_value"):
        DatumTransform.from_layer(_layer(tmp_path, 'mean_file: "m" mean_value: 3'), "TRAIN")
    with pytest.raises(DataError, match="mean_file 'nope.binaryproto' does not exist"):
        DatumTransform.from_layer(_layer(tmp_path, 'mean_file: "nope.binaryproto"'), "TRAIN", [tmp_path])
    t = DatumTransform.from_layer(_layer(tmp_path, "mean_value: 1 mean_value: 2 crop_size: 5"), "TRAIN")
    with pytest.raises(DataError, match="crop_size is 5"):
        t.check((2, 4, 8), "db")
    with pytest.raises(DataError, match="2 mean_value entries for 3-channel"):
        t.check((3, 8, 8), "db")


# --------------------------------------------------------------------------- sharding


def _indexed_lmdb(path: Path, n: int, shape=(1, 2, 2)) -> Path:
    images = (np.arange(n, dtype=np.int64) % 256).astype(np.uint8)[:, None, None, None] * np.ones(
        shape, np.uint8
    )
    write_datum_db(path, images, np.arange(n))
    return path


def _epoch(source, world: int, epoch: int, seed: int = 3, batch: int = 4, shuffle: bool = True):
    per_rank = []
    for rank in range(world):
        batches = list(
            source.batches(
                rank=rank, world_size=world, epoch=epoch, batch_size=batch, seed=seed, shuffle=shuffle
            )
        )
        for x, y in batches:  # every row still carries its own record's pixels
            assert torch.equal(x[:, 0, 0, 0], (y % 256).float())
        per_rank.append(torch.cat([y for _, y in batches]).tolist())
    return per_rank


def test_lmdb_records_are_sharded_once_per_epoch_deterministically(tmp_path):
    source = DatumDBSource(_indexed_lmdb(tmp_path / "db", 103), block_rows=8, shuffle_buffer=16)
    assert source.num_samples() == 103 and source.blocks == [8] * 12 + [7] and source.equal_batches
    ranks = _epoch(source, 3, epoch=0)
    assert [len(r) for r in ranks] == [35, 35, 35]  # ceil(103 / 3) each: equal batches
    seen = sum(ranks, [])
    assert sorted(set(seen)) == list(range(103))  # every record ...
    dups = [v for v in set(seen) if seen.count(v) > 1]
    assert len(seen) - 103 == 2 and len(dups) == 2  # ... once, but the 2 wrapped-around rows of the last rank
    assert ranks == _epoch(pickle.loads(pickle.dumps(source)), 3, epoch=0)  # seeded; shipped by pickling
    assert ranks != _epoch(source, 3, epoch=1) and ranks != _epoch(source, 3, epoch=0, seed=4)
    evaluated = [
        torch.cat([y for _, y in source.eval_batches(rank=r, world_size=3, batch_size=10)]).tolist()
        for r in range(3)
    ]
    assert sum(evaluated, []) == list(range(103))  # evaluation: storage order, each record exactly once
    plain = _epoch(source, 2, epoch=5, shuffle=False)
    assert plain == [list(range(52)), list(range(52, 103)) + [0]]
    small = DatumDBSource(tmp_path / "db", limit=10)
    assert small.num_samples() == 10 and sorted(sum(_epoch(small, 2, 0), [])) == list(range(10))


def test_hdf5_source_shards_rows_across_files_and_honours_shuffle(tmp_path):
    x = np.arange(50, dtype=np.float32)[:, None, None, None] * np.ones((1, 2, 2), np.float32)
    parts = [
        {"data": x[:30], "label": np.arange(30, dtype=np.float32)},
        {"data": x[30:], "label": np.arange(30, 50, dtype=np.float32)[:, None]},
    ]
    write_hdf5_source(tmp_path / "train.txt", parts[:1])
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["data"], f["label"] = parts[1]["data"], parts[1]["label"].reshape(20)
    (tmp_path / "train.txt").write_text("train_0.h5\n\n" + str(tmp_path / "b.h5") + "\n")
    ordered = HDF5Source(tmp_path / "train.txt", block_rows=7, shuffle=False)
    assert ordered.num_samples() == 50 and ordered.sample_shape == (1, 2, 2)
    ranks = _epoch(ordered, 2, epoch=0)
    assert ranks == [list(range(25)), list(range(25, 50))]  # shuffle: false keeps Caffe's storage order
    shuffled = HDF5Source(tmp_path / "train.txt", block_rows=7, shuffle=True)
    ranks = _epoch(shuffled, 2, epoch=0)
    assert sorted(sum(ranks, [])) == list(range(50)) and ranks != [list(range(25)), list(range(25, 50))]
    assert ranks == _epoch(pickle.loads(pickle.dumps(shuffled)), 2, epoch=0)
    x0, y0 = next(shuffled.batches(rank=0, world_size=1, epoch=0, batch_size=50, seed=0))
    assert x0.dtype == torch.float32 and y0.dtype == torch.int64 and y0.shape == (50,)
    floats = HDF5Source(tmp_path / "train.txt", class_labels=False)
    assert next(floats.eval_batches(rank=0, world_size=1, batch_size=5))[1].dtype == torch.float32


# ------------------------------------------------------------------- from a prototxt

NET = """
name: "small"
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 crop_size: 20 mirror: true }
        data_param { source: "train_lmdb" batch_size: 8 backend: LMDB } }
layer { name: "d" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 crop_size: 20 }
        data_param { source: "test_lmdb" batch_size: 8 } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_net_data_reads_both_phases_relative_to_the_prototxt(tmp_path, monkeypatch):
    from sparkdp.caffe.solver_spec import read_solver_spec
    from sparkdp.caffe.train import build_model

    _indexed_lmdb(tmp_path / "train_lmdb", 40, (1, 28, 28))
    _indexed_lmdb(tmp_path / "test_lmdb", 12, (1, 28, 28))
    (tmp_path / "net.prototxt").write_text(NET)
    monkeypatch.chdir(tmp_path.parent)  # not where the databases are: found next to the prototxt
    data = net_data(tmp_path / "net.prototxt")
    assert (
        data.sample_shape == (1, 20, 20) and data.train.num_samples() == 40 and data.eval.num_samples() == 12
    )
    assert data.train.transform.train and data.train.transform.mirror and not data.eval.transform.train
    assert data.eval.backend == "lmdb"  # no backend stated (Caffe's default LEVELDB): told by data.mdb
    spec = read_solver_spec('base_lr: 0.1 lr_policy: "fixed"')
    model = build_model(
        tmp_path / "net.prototxt", spec, sample_shape=data.sample_shape, raw_scale=1.0, apply_transform=False
    )  # crop_size/mirror are the source's job: no refusal here
    data.check_model(model)
    x, y = next(data.eval.eval_batches(rank=0, world_size=1, batch_size=8))
    assert x.shape == (8, 1, 20, 20) and torch.allclose(x[:, 0, 0, 0], y.float() / 256)
    assert model(x).shape == (8, 10)


def test_lenet_on_its_lmdb_equals_lenet_on_the_built_in_dataset(tmp_path):
    """The source applies transform_param and the classifier does not: one transform, not two."""
    from sparkdp.caffe.classifier import CaffeClassifier

    images = np.random.default_rng(0).integers(0, 256, (6, 1, 28, 28), dtype=np.uint8)
    write_datum_db(tmp_path / "train_lmdb", images, np.arange(6))
    write_datum_db(tmp_path / "test_lmdb", images, np.arange(6))
    text = (EXAMPLES / "lenet_train_test.prototxt").read_text()
    text = text.replace("examples/mnist/mnist_train_lmdb", str(tmp_path / "train_lmdb"))
    (tmp_path / "lenet.prototxt").write_text(text.replace("examples/mnist/mnist_test_lmdb", "test_lmdb"))
    data = net_data(tmp_path / "lenet.prototxt")
    torch.manual_seed(0)
    own = CaffeClassifier(tmp_path / "lenet.prototxt", sample_shape=data.sample_shape, apply_transform=False)
    torch.manual_seed(0)
    builtin = CaffeClassifier(tmp_path / "lenet.prototxt", sample_shape=(1, 28, 28), raw_scale=255.0)
    x, _ = next(data.eval.eval_batches(rank=0, world_size=1, batch_size=6))
    torch.testing.assert_close(own(x), builtin(torch.from_numpy(images).float() / 255.0))


# ------------------------------------------------------------------------------ errors


def test_missing_or_wrong_databases_are_explained(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    with pytest.raises(DataError, match=r"data_param source 'train_lmdb' does not exist .*convert_imageset"):
        net_data(tmp_path / "net.prototxt")
    (tmp_path / "train_lmdb").mkdir()
    (tmp_path / "train_lmdb" / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match=r"train_lmdb' is not an LMDB database \(no data.mdb inside\)"):
        net_data(tmp_path / "net.prototxt")
    with pytest.raises(DataError, match="is not a LevelDB database"):
        DatumDBSource(tmp_path / "train_lmdb", backend="leveldb")
    _indexed_lmdb(tmp_path / "lmdb", 3)
    with pytest.raises(DataError, match=r"is an LMDB database but the layer says backend: LEVELDB"):
        DatumDBSource(tmp_path / "lmdb", backend="leveldb")
    with pytest.raises(ConfigError, match="no Data or HDF5Data layer in its TRAIN phase"):
        net_data('layer { name: "i" type: "Input" top: "data" input_param { shape { dim: 1 } } }')


def test_records_of_another_size_are_refused_naming_the_record(tmp_path):
    images = [np.zeros((1, 4, 4), np.uint8)] * 5 + [np.zeros((1, 5, 4), np.uint8)]
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i, image in enumerate(images):
            txn.put(f"{i:08d}".encode(), encode_datum(image, 0))
        txn.put(b"99999999", b"\x08\x01\x10\x02\x22\x09")  # truncated
    env.close()
    source = DatumDBSource(tmp_path / "db", block_rows=100)
    with pytest.raises(DataError, match=r"record b'00000005' is 1×5×4 \(C×H×W\) but the net's input.* 1×4×4"):
        list(source.eval_batches(rank=0, world_size=1, batch_size=2))
    with pytest.raises(DataError, match=r"record b'99999999': truncated or corrupt Caffe Datum"):
        list(DatumDBSource(tmp_path / "db", block_rows=1).eval_batches(rank=6, world_size=7, batch_size=10))
    # the TEST source must feed the net's (TRAIN-built) input shape
    _indexed_lmdb(tmp_path / "train_lmdb", 4, (1, 28, 28))
    _indexed_lmdb(tmp_path / "test_lmdb", 4, (1, 24, 24))
    (tmp_path / "net.prototxt").write_text(NET.replace("crop_size: 20", ""))
    with pytest.raises(
        DataError, match=r"TEST source .* gives rows of shape \(1, 24, 24\) .* is \(1, 28, 28\)"
    ):
        net_data(tmp_path / "net.prototxt")


def test_hdf5_list_naming_missing_files_names_them_with_file_and_line(tmp_path):
    write_hdf5_source(tmp_path / "list.txt", [{"data": np.zeros((4, 3)), "label": np.zeros(4)}])
    (tmp_path / "list.txt").write_text("list_0.h5\nmissing_a.h5\n\n/nowhere/b.h5\n")
    with pytest.raises(
        DataError, match=r"2 file\(s\) named in .*list.txt:2: missing_a.h5; .*list.txt:4: /nowhere/b.h5"
    ):
        HDF5Source(tmp_path / "list.txt")
    (tmp_path / "list.txt").write_text("list_0.h5\n")
    with pytest.raises(DataError, match=r"list.txt:1: .* has no dataset 'target'"):
        HDF5Source(tmp_path / "list.txt", label_top="target")
    with pytest.raises(DataError, match="hdf5_data_param source .* does not exist"):
        HDF5Source(tmp_path / "nope.txt")


@pytest.mark.parametrize(
    "package, call, extra",
    [
        (
            "lmdb",
            lambda p: DatumDBSource(p / "lmdb"),
            "LMDB sources need the lmdb package: pip install 'sparkdp[caffe-data]'",
        ),
        (
            "plyvel",
            lambda p: DatumDBSource(p / "ldb", backend="leveldb"),
            "LevelDB sources need the plyvel package: pip install 'sparkdp[caffe-leveldb]'",
        ),
        (
            "h5py",
            lambda p: HDF5Source(p / "list.txt"),
            "HDF5 sources need the h5py package: pip install 'sparkdp[caffe-data]'",
        ),
    ],
)
def test_missing_optional_packages_name_the_extra(tmp_path, monkeypatch, package, call, extra):
    _indexed_lmdb(tmp_path / "lmdb", 2)
    (tmp_path / "ldb").mkdir()
    (tmp_path / "ldb" / "CURRENT").write_text("MANIFEST-000001\n")
    (tmp_path / "list.txt").write_text("a.h5\n")
    monkeypatch.setitem(sys.modules, package, None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=extra.replace("[", r"\[").replace("]", r"\]")):
        call(tmp_path)


def test_leveldb_source_reads_and_waits_for_the_lock(tmp_path):
    plyvel = pytest.importorskip("plyvel")
    images = np.arange(20, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 2), np.uint8)
    write_datum_db(tmp_path / "ldb", images, np.arange(20), backend="leveldb")
    (tmp_path / "net.prototxt").write_text(
        NET.replace('"train_lmdb"', '"ldb"')
        .replace("backend: LMDB", "")
        .replace("crop_size: 20", "")
        .replace('"test_lmdb"', '"ldb"')
        .replace("scale: 0.00390625", "")
    )
    data = net_data(tmp_path / "net.prototxt")  # no backend: Caffe's default, LEVELDB
    assert data.train.backend == "leveldb" and data.sample_shape == (1, 2, 2)
    assert sorted(sum(_epoch(data.train, 2, epoch=0), [])) == list(range(20))
    holder = plyvel.DB(str(tmp_path / "ldb"))  # another "rank" holds LevelDB's one-process lock ...
    threading.Timer(0.3, holder.close).start()  # ... for a moment
    started = time.monotonic()
    labels = torch.cat([y for _, y in data.eval.eval_batches(rank=0, world_size=1, batch_size=7)]).tolist()
    assert labels == list(range(20)) and time.monotonic() - started >= 0.25


# ----------------------------------------------------------------------------- Spark

HDF5_NET = """
name: "hdf5_softmax"
layer { name: "d" type: "HDF5Data" top: "data" top: "label" include { phase: TRAIN }
        hdf5_data_param { source: "train.txt" batch_size: 32 shuffle: true } }
layer { name: "d" type: "HDF5Data" top: "data" top: "label" include { phase: TEST }
        hdf5_data_param { source: "test.txt" batch_size: 100 } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


@pytest.mark.spark
def test_fit_caffe_trains_from_the_nets_hdf5_sources(spark, tmp_path):
    from sparkdp.caffe.train import fit_caffe
    from sparkdp.data import load_dataset

    try:
        ds = load_dataset("fashion-mnist", limit=2000)
    except DataError:
        pytest.skip("dataset-fashion-mnist is not installed")
    x, xt = ds.x_train.reshape(-1, 784), ds.x_test.reshape(-1, 784)
    # labels as float32, as Caffe's HDF5 examples store them; two training files
    write_hdf5_source(
        tmp_path / "train.txt",
        [
            {"data": x[:1200], "label": ds.y_train[:1200].astype(np.float32)},
            {"data": x[1200:], "label": ds.y_train[1200:].astype(np.float32)},
        ],
    )
    write_hdf5_source(tmp_path / "test.txt", [{"data": xt, "label": ds.y_test.astype(np.float32)}])
    (tmp_path / "net.prototxt").write_text(HDF5_NET)
    solver = 'base_lr: 0.05 momentum: 0.9 lr_policy: "fixed" max_iter: 100'
    result = fit_caffe(
        tmp_path / "net.prototxt", solver, workers=2, epochs=3, spark=spark, show_progress=False
    )
    assert result.epochs == 3 and result.history[-1]["samples"] == 2000
    assert result.history[-1]["test_accuracy"] > 0.7, result.history


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shape", [(2, 1 << 32, 1 << 32), (1 << 60, 1)], ids=["huge rows", "huge row count"])
def test_hdf5_datasets_larger_than_a_caffe_blob_are_refused(tmp_path, shape):
    """Unwritten HDF5 chunks take no space: a 2 KB file can declare rows of 2**32 x 2**32 values, or
    2**60 rows (which would have become 2**52 read units)."""
    with h5py.File(tmp_path / "huge.h5", "w") as f:
        f.create_dataset("data", shape=shape, dtype="f4", chunks=(1,) * len(shape))
        f["label"] = np.zeros(2, np.float32)
    (tmp_path / "list.txt").write_text("huge.h5\n")
    with pytest.raises(
        DataError,
        match=r"has shape \(.*\); Caffe loads it into one blob, which has at most 32 "
        r"axes and 2,147,483,647 values",
    ):
        HDF5Source(tmp_path / "list.txt")


def _blank_png(width: int, height: int) -> bytes:
    """A grey PNG of one colour: a few KiB that decode to width × height bytes."""
    rows = zlib.compress(bytes((width + 1) * height), 9)  # filter byte 0, then the row's zeros
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + _png_chunk(b"IDAT", rows)
        + _png_chunk(b"IEND", b"")
    )


def _encoded_record(png: bytes) -> bytes:
    return b"\x22" + _varint(len(png)) + png + b"\x38\x01"  # data (4), encoded (7) = true


def _varint(v: int) -> bytes:
    out = b""
    while v >= 0x80:
        out, v = out + bytes([v & 0x7F | 0x80]), v >> 7
    return out + bytes([v])


def _peak_mib(call) -> float:
    import tracemalloc

    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.timeout(60)
def test_an_encoded_image_larger_than_the_pixel_limit_is_refused_before_decoding():
    """6000 x 6000 (36 Mpx, below Pillow's own bomb check) in a ~40 KiB record."""
    from sparkdp.caffe import datum

    record = _encoded_record(_blank_png(6000, 6000))
    assert len(record) < 64 << 10

    def refused():
        with pytest.raises(
            DataError, match=r"is 6000×6000 pixels, more than .*MAX_IMAGE_PIXELS .* refused before"
        ):
            decode_datum(record)

    assert _peak_mib(refused) < 2
    assert decode_datum(_encoded_record(_blank_png(40, 30)))[0].shape == (1, 30, 40)
    assert 6000 * 6000 > datum.MAX_IMAGE_PIXELS >= 4096 * 4096


@pytest.mark.timeout(60)
def test_an_encoded_record_larger_than_the_nets_input_is_refused_before_decoding(tmp_path):
    """The first record (4 x 4) sets the net's input; a 3000 x 3000 image after it is refused by its header."""
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 22)
    with env.begin(write=True) as txn:
        txn.put(b"0", _encoded_record(_blank_png(4, 4)))
        txn.put(b"1", _encoded_record(_blank_png(3000, 3000)))
    env.close()
    source = DatumDBSource(tmp_path / "db", block_rows=100)
    assert source.record_shape == (1, 4, 4)

    def refused():
        with pytest.raises(
            DataError, match=r"record b'1' is 3000×3000 \(H×W\) but the net's input.* is 1×4×4"
        ):
            list(source.eval_batches(rank=0, world_size=1, batch_size=2))

    assert _peak_mib(refused) < 4  # decoding it would take 9 MiB, and 36 more as float32


_OPEN_IN_CHILD = """
import sys
from sparkdp.caffe.sources import DatumDBSource
from sparkdp.errors import DataError
try:
    source = DatumDBSource(sys.argv[1], block_rows=8)
    print("read", sum(len(y) for _x, y in source.eval_batches(rank=0, world_size=1, batch_size=8)))
except DataError as exc:
    print("DataError:", exc)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "meta-points-past-the-end"])
def test_a_damaged_lmdb_is_refused_instead_of_crashing_the_worker(tmp_path, damage):
    """LMDB maps data.mdb and reads a page past its end as a SIGBUS, which no Python code can
    catch: opened in a child process, such a database must give a DataError, not a dead process."""
    good = _indexed_lmdb(tmp_path / "good", 300, (1, 8, 8))
    data = bytearray((good / "data.mdb").read_bytes())
    page = struct.unpack_from("<I", data, 40)[0]  # lmdb.h: the free tree's md_pad holds the page size
    if damage == "truncated":
        del data[3 * page :]  # a partial copy: both meta pages and one more
    else:
        for meta in (0, page):  # both meta pages: the main tree's root and the last page far past the end
            struct.pack_into("<QQ", data, meta + 128, 900, 1000)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data.mdb").write_bytes(bytes(data))
    import subprocess

    src = str(Path(__file__).resolve().parents[2] / "src")
    for db, expected in ((good, "read 300"), (tmp_path / "bad", "DataError: LMDB ")):
        run = subprocess.run(
            [sys.executable, "-c", _OPEN_IN_CHILD, str(db)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**__import__("os").environ, "PYTHONPATH": src},
        )
        assert run.returncode == 0, f"the child died with {run.returncode} on the {damage} database"
        assert run.stdout.startswith(expected), run.stdout + run.stderr
    assert "Copy the database again" in run.stdout
