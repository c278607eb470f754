"""Arrow record batch -> tensor conversion, each column kind against numpy-computed values."""

import io

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from sparkdp.data.arrow import ArrowConverter
from sparkdp.errors import DataError

VECTOR = pa.struct(
    [
        ("type", pa.int8()),
        ("size", pa.int32()),
        ("indices", pa.list_(pa.int32())),
        ("values", pa.list_(pa.float64())),
    ]
)


def _convert(columns, features, label=None, **kw):
    batch = pa.RecordBatch.from_pydict(columns)
    conv = ArrowConverter(batch.schema, features, label, **kw)
    return conv, conv.convert(batch)


def test_scalar_columns_are_assembled_in_order():
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(size=5), rng.integers(0, 9, 5).astype(np.int32), rng.random(5) > 0.5
    conv, (x, y) = _convert({"a": a, "b": b, "c": c, "y": np.arange(5)}, ["a", "b", "c"], "y")
    expected = np.stack([a, b, c], axis=1).astype(np.float32)
    assert x.dtype == torch.float32 and np.array_equal(x.numpy(), expected)
    assert y.dtype == torch.int64 and y.tolist() == list(range(5))
    assert conv.layout()["features"]["shape"] == (3,)


@pytest.mark.parametrize(
    "arrow_type",
    [
        pa.list_(pa.float32()),
        pa.list_(pa.float64()),
        pa.large_list(pa.float32()),
        pa.list_(pa.int64()),
        pa.list_(pa.float32(), 6),
    ],
)
def test_arrays_and_fixed_shape(arrow_type):
    values = np.arange(24, dtype=np.float64).reshape(4, 6)
    col = pa.array([list(r) for r in values], type=arrow_type)
    _, (x, y) = _convert({"v": col, "y": [0.5, 1.5, 2.5, 3.5]}, "v", "y")
    assert np.array_equal(x.numpy(), values.astype(np.float32))
    assert y.dtype == torch.float32 and y.tolist() == [0.5, 1.5, 2.5, 3.5]
    conv, (x3,) = _convert({"v": col}, "v", feature_shape=(1, 2, 3))
    assert np.array_equal(x3.numpy(), values.reshape(4, 1, 2, 3).astype(np.float32))
    assert "(batch, 1, 2, 3)" in conv.describe()


def test_mixed_scalar_and_array_columns_concatenate():
    _, (x,) = _convert({"s": [1.0, 2.0], "v": pa.array([[3.0, 4.0], [5.0, 6.0]])}, ["s", "v"])
    assert x.tolist() == [[1, 3, 4], [2, 5, 6]]


def test_spark_ml_vectors_dense_and_sparse_and_sliced():
    rows = [
        {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0, 4.0]},
        {"type": 0, "size": 4, "indices": [0, 3], "values": [5.0, 6.0]},
        {"type": 0, "size": 4, "indices": [], "values": []},
        {"type": 1, "size": None, "indices": None, "values": [7.0, 8.0, 9.0, 10.0]},
    ]
    expected = np.array([[1, 2, 3, 4], [5, 0, 0, 6], [0, 0, 0, 0], [7, 8, 9, 10]], dtype=np.float32)
    batch = pa.RecordBatch.from_pydict({"v": pa.array(rows, type=VECTOR), "y": [0, 1, 2, 3]})
    conv = ArrowConverter(batch.schema, "v", "y")
    x, y = conv.convert(batch)
    assert np.array_equal(x.numpy(), expected)
    x, y = conv.convert(batch.slice(1, 2))  # Arrow offsets must be honoured
    assert np.array_equal(x.numpy(), expected[1:3]) and y.tolist() == [1, 2]


def _png(pixels, fmt="PNG"):
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def test_images_png_gray_and_rgb_and_jpeg():
    rng = np.random.default_rng(0)
    gray = rng.integers(0, 256, (3, 5, 4), dtype=np.uint8)
    _, (x, y) = _convert({"img": [_png(g) for g in gray], "y": [0, 1, 2]}, "img", "y")
    assert x.shape == (3, 1, 5, 4)
    assert np.allclose(x.numpy(), gray[:, None] / 255.0)
    rgb = rng.integers(0, 256, (2, 6, 7, 3), dtype=np.uint8)
    _, (x,) = _convert({"img": [_png(p) for p in rgb]}, "img")
    assert np.allclose(x.numpy(), rgb.transpose(0, 3, 1, 2) / 255.0)
    jpeg = [_png(p, "JPEG") for p in rgb]
    _, (x,) = _convert({"img": jpeg}, "img", feature_shape=(3, 6, 7))
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in jpeg])
    assert np.allclose(x.numpy(), decoded.transpose(0, 3, 1, 2) / 255.0)


# ------------------------------------------------------------------ bad input
def test_missing_column_lists_available():
    with pytest.raises(DataError, match=r"column 'z' is not in the data. Available columns: a, y"):
        _convert({"a": [1.0], "y": [1]}, "z", "y")


def test_unsupported_type_names_type_and_supported():
    with pytest.raises(
        DataError,
        match=r"column 's' has type string, which cannot become a tensor.*Supported: "
        r"integer",
    ):
        _convert({"s": ["a"]}, "s")


def test_ragged_arrays_report_first_offending_row():
    col = pa.array([[1.0] * 4, [1.0] * 4, [1.0] * 3, [1.0] * 5])
    with pytest.raises(
        DataError,
        match=r"column 'v' is ragged: row 2 .* holds 3 values, but feature_shape "
        r"\(2, 2\) needs 4",
    ):
        _convert({"v": col}, "v", feature_shape=(2, 2))
    with pytest.raises(DataError, match=r"row 2 .* holds 3 values, but earlier rows hold 4"):
        _convert({"v": col}, "v")


def test_nulls_error_by_default_and_drop_nulls_counts():
    cols = {"v": pa.array([[1.0, 2.0], None, [3.0, None], [4.0, 5.0]]), "y": pa.array([0, 1, 1, None])}
    with pytest.raises(DataError, match=r"feature column 'v' has a null value \(first at row 1"):
        _convert(cols, "v", "y")
    conv, (x, y) = _convert(cols, "v", "y", drop_nulls=True)
    assert x.tolist() == [[1.0, 2.0]] and y.tolist() == [0]
    assert conv.dropped == 3
    with pytest.raises(DataError, match=r"label column 'y' has a null value"):
        _convert({"v": [1.0, 2.0], "y": pa.array([None, 1])}, "v", "y")


def test_labels_outside_classes():
    with pytest.raises(
        DataError, match=r"label column 'y' has label 3 at row 2 .* labels must lie in \[0, 3\)"
    ):
        _convert({"v": [1.0, 2.0, 3.0], "y": [0, 2, 3]}, "v", "y", num_classes=3)


def test_unreadable_image():
    blobs = [_png(np.zeros((2, 2), np.uint8)), b"not an image"]
    with pytest.raises(DataError, match=r"image column 'img': row 1 .* is not a readable image"):
        _convert({"img": blobs}, "img")


def test_empty_feature_list_and_binary_label():
    with pytest.raises(DataError, match="features must be a column name or a list"):
        _convert({"a": [1.0]}, [])
    with pytest.raises(DataError, match="label column 'b' holds binary data"):
        _convert({"a": [1.0], "b": [b"x"]}, "a", "b")
