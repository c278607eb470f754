"""Arrow record batches -> ``(features, labels)`` tensors, one batch at a time.

An :class:`ArrowConverter` is built once from the data's Arrow schema (on the
driver, so a wrong column name or type fails before any Spark job starts) and
shipped to the workers, where :meth:`ArrowConverter.convert` turns each record
batch into tensors with vectorised numpy (no per-row Python except for image
decoding). Column kinds:

* ``scalar``: integer / floating / boolean columns; several are assembled into one vector;
* ``array``: ``array<float|double|int...>`` (Arrow lists), optionally reshaped to ``feature_shape``;
* ``vector``: Spark ML ``VectorUDT`` (dense or sparse), which reaches Arrow as the
  struct ``{type: int8, size: int32, indices: list<int32>, values: list<double>}``;
* ``image``: binary PNG/JPEG bytes decoded with Pillow into float32 CHW in [0, 1].

With ``dict_batches`` each feature column becomes its own tensor instead, keyed by column
name (``{"input_ids": ..., "attention_mask": ..., "labels": ...}`` for ``model(**batch)``):
integer scalars and arrays stay int64, an ``array<int>`` column of L values per row becomes
a (rows, L) tensor by one reshape of the Arrow list's flat values (no per-row Python).

No pyspark here: the same converter serves Parquet files read by pyarrow and
Spark partitions streamed through ``mapInArrow``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..errors import DataError

SUPPORTED = (
    "integer, floating-point or boolean scalars; array<float|double|int|long> (Arrow list); "
    "Spark ML vectors (VectorUDT, dense or sparse); binary PNG/JPEG image bytes"
)
_VECTOR_FIELDS = {"type", "size", "indices", "values"}
_IMAGE_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# the Arrow arrays of an "array" column (and of a Spark ML vector's values/indices)
_ListArray = pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray


@dataclass
class ColumnInfo:
    """One input column and what it contributes to a tensor."""

    name: str
    kind: str  # "scalar" | "array" | "vector" | "image"
    arrow_type: str
    width: int | None = None  # values per row, once seen (scalar: 1)
    image_shape: tuple[int, int, int] | None = None


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_list(t: pa.DataType) -> TypeGuard[pa.ListType | pa.LargeListType | pa.FixedSizeListType]:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def column_kind(name: str, t: pa.DataType) -> str:
    """Classify an Arrow type, or raise a DataError naming the column and the supported kinds."""
    if _is_numeric(t):
        return "scalar"
    if _is_list(t) and _is_numeric(t.value_type):
        return "array"
    if pa.types.is_struct(t) and {t.field(i).name for i in range(t.num_fields)} == _VECTOR_FIELDS:
        return "vector"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "image"
    hint = " (nested arrays: flatten them and pass feature_shape)" if _is_list(t) else ""
    raise DataError(
        f"column {name!r} has type {t}, which cannot become a tensor{hint}. Supported: {SUPPORTED}. "
        "Cast or convert the column first (e.g. with Spark's cast / vector_to_array)."
    )


def _names(value: str | Sequence[str] | None, what: str) -> list[str]:
    if value is None:
        return []
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise DataError(f"{what} must be a column name or a list of column names; got {value!r}.")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"{what} names column(s) {twice} more than once; list each column once.")
    return names


class ArrowConverter:
    """Turns record batches of a fixed schema into ``(features, labels)`` tensors.

    Args:
        schema: the Arrow schema of the batches.
        features: a column name or a list of them (scalars/arrays/vectors are
            concatenated per row into one vector; an image column must stand alone).
        label: the label column, or None for inference.
        feature_shape: per-row shape of the features, e.g. ``(1, 28, 28)``; arrays
            must then hold exactly ``prod(feature_shape)`` values per row.
        drop_nulls: drop rows with a null feature or label (counted in ``dropped``)
            instead of raising.
        num_classes: when set and labels are integers, every batch's labels must lie
            in ``[0, num_classes)``.
        dict_batches: each feature column its own tensor (see the module docstring);
            batches are then ``({column: tensor}, labels or None)``.
    """

    def __init__(
        self,
        schema: pa.Schema,
        features: str | Sequence[str],
        label: str | None = None,
        *,
        feature_shape: Sequence[int] | None = None,
        drop_nulls: bool = False,
        num_classes: int | None = None,
        dict_batches: bool = False,
    ) -> None:
        names = _names(features, "features")
        if not names:
            raise DataError("no feature columns given: pass features='col' or features=['a', 'b', ...].")
        available = list(schema.names)
        for name in names + ([label] if label else []):
            if name not in available:
                raise DataError(
                    f"column {name!r} is not in the data. Available columns: {', '.join(available)}. "
                    "Pass features=/label= naming existing columns."
                )
        self.features = [
            ColumnInfo(n, column_kind(n, schema.field(n).type), str(schema.field(n).type)) for n in names
        ]
        self.label = None
        if label:
            t = schema.field(label).type
            kind = column_kind(label, t)
            if kind == "image":
                raise DataError(
                    f"label column {label!r} holds binary data ({t}); labels must be numbers "
                    "(int for classes, float for regression) or numeric arrays."
                )
            self.label = ColumnInfo(label, kind, str(t), width=1 if kind == "scalar" else None)
        self.label_dtype = (
            torch.int64
            if self.label
            and self.label.kind == "scalar"
            and pa.types.is_integer(schema.field(self.label.name).type)
            else torch.float32
        )
        self.dict_batches = bool(dict_batches)
        if self.dict_batches and feature_shape:
            raise DataError(
                "feature_shape reshapes one concatenated feature tensor; with dict_batches each column "
                "keeps its own shape. Drop feature_shape."
            )
        self.integer = {n for n in names if _integer_values(schema.field(n).type)}
        if any(c.kind == "image" for c in self.features) and len(self.features) > 1 and not self.dict_batches:
            raise DataError(
                f"image column(s) {[c.name for c in self.features if c.kind == 'image']} must be the "
                "only feature column; train on images and other columns with separate models."
            )
        self.feature_shape = tuple(int(s) for s in feature_shape) if feature_shape else None
        if self.feature_shape is not None and (not self.feature_shape or min(self.feature_shape) < 1):
            raise DataError(
                f"feature_shape must be positive sizes such as (1, 28, 28); got {feature_shape!r}."
            )
        for c in self.features:
            if c.kind == "scalar":
                c.width = 1
            elif c.kind == "array" and pa.types.is_fixed_size_list(schema.field(c.name).type):
                c.width = schema.field(c.name).type.list_size
        if len(self.features) == 1 and self.features[0].kind in ("array", "vector") and self.feature_shape:
            self.features[0].width = math.prod(self.feature_shape)
        self.drop_nulls = bool(drop_nulls)
        self.num_classes = num_classes
        self.dropped = 0  # rows dropped for nulls (drop_nulls=True)
        self.rows_seen = 0  # rows this converter has read, for error messages

    @property
    def columns(self) -> list[str]:
        """The columns to read, features first."""
        return [c.name for c in self.features] + ([self.label.name] if self.label else [])

    # ----------------------------------------------------------------- conversion
    def convert(self, batch: pa.RecordBatch) -> tuple[torch.Tensor, ...]:
        """``(features, labels)`` of one record batch (``(features,)`` without a label column);
        with ``dict_batches`` one tensor per feature column, then the labels (:meth:`pack`
        turns such a tuple into a batch)."""
        batch = self._handle_nulls(batch)
        if self.dict_batches:
            out: tuple[torch.Tensor, ...] = tuple(
                self._column(info, batch.column(info.name)) for info in self.features
            )
        else:
            out = (self._features(batch),)
        if self.label is not None:
            out = (*out, self._labels(batch))
        self.rows_seen += batch.num_rows
        return out

    def pack(self, tensors: Sequence[Any]) -> tuple[Any, ...]:
        """A batch from :meth:`convert`'s tensors (re-batched): ``(features, labels)`` as they are,
        or with ``dict_batches`` ``({column: tensor}, labels or None)``."""
        if not self.dict_batches:
            return tuple(tensors)
        k = len(self.features)
        x = {info.name: t for info, t in zip(self.features, tensors[:k], strict=True)}
        return x, (tensors[k] if self.label is not None else None)

    def preview(self, batch: pa.RecordBatch) -> tuple[Any, ...]:
        """Convert a sample (on the driver) without counting its rows: errors surface early and
        array widths / image sizes are learned, so the workers check their data against them.
        Returns the batch as :meth:`pack` makes it."""
        seen, dropped = self.rows_seen, self.dropped
        try:
            return self.pack(self.convert(batch))
        finally:
            self.rows_seen, self.dropped = seen, dropped

    def _column(self, info: ColumnInfo, arr: pa.Array) -> torch.Tensor:
        """One column as its own tensor (``dict_batches``): integers as int64, the rest float32;
        an array column of L values per row as (rows, L)."""
        if info.kind == "image":
            return torch.from_numpy(self._images(info, arr))
        if info.name not in self.integer:
            matrix = self._matrix(info, arr)
            return _tensor(matrix[:, 0] if info.kind == "scalar" else matrix)
        arr = _plain(arr)
        if info.kind == "scalar":
            return torch.from_numpy(np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64))
        lengths = (
            np.full(len(arr), arr.type.list_size)
            if pa.types.is_fixed_size_list(arr.type)
            else pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        )
        width = self._check_widths(info, lengths)
        values = cast(_ListArray, arr).flatten().to_numpy(zero_copy_only=False)
        return _tensor(np.asarray(values, dtype=np.int64).reshape(len(arr), width))

    def _handle_nulls(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keep = None
        for info in self.features + ([self.label] if self.label else []):
            valid = _valid_rows(batch.column(info.name), info.kind)
            if valid is None:
                continue
            if not self.drop_nulls:
                row = self.rows_seen + int(np.argmin(valid))
                role = "label" if info is self.label else "feature"
                raise DataError(
                    f"{role} column {info.name!r} has a null value (first at row {row} of this "
                    f"worker's data). Pass drop_nulls=True to skip such rows (they are counted and "
                    "reported), or fill them first (df.na.fill / df.na.drop)."
                )
            keep = valid if keep is None else keep & valid
        if keep is None:
            return batch
        self.dropped += int((~keep).sum())
        return batch.filter(pa.array(keep))

    def _features(self, batch: pa.RecordBatch) -> torch.Tensor:
        if self.features[0].kind == "image":
            return torch.from_numpy(self._images(self.features[0], batch.column(self.features[0].name)))
        parts = [self._matrix(info, batch.column(info.name)) for info in self.features]
        flat = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        if self.feature_shape is not None:
            if flat.shape[1] != math.prod(self.feature_shape):
                raise DataError(
                    f"the feature columns {[c.name for c in self.features]} give {flat.shape[1]} "
                    f"values per row, but feature_shape {self.feature_shape} needs "
                    f"{math.prod(self.feature_shape)}. Fix feature_shape or the columns."
                )
            flat = flat.reshape((len(flat),) + self.feature_shape)
        return _tensor(flat)

    def _labels(self, batch: pa.RecordBatch) -> torch.Tensor:
        info = self.label
        assert info is not None
        arr = _plain(batch.column(info.name))
        if info.kind == "scalar":
            dtype = np.int64 if self.label_dtype == torch.int64 else np.float32
            y = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype).copy()
            if self.num_classes is not None and dtype == np.int64 and len(y):
                lo, hi = int(y.min()), int(y.max())
                if lo < 0 or hi >= self.num_classes:
                    bad = int(np.nonzero((y < 0) | (y >= self.num_classes))[0][0])
                    raise DataError(
                        f"label column {info.name!r} has label {int(y[bad])} at row "
                        f"{self.rows_seen + bad} of this worker's data, but the model has "
                        f"{self.num_classes} outputs, so labels must lie in [0, {self.num_classes}). "
                        "Fix the labels or the model's output size."
                    )
            return torch.from_numpy(y)
        return _tensor(self._matrix(info, arr))

    def _matrix(self, info: ColumnInfo, arr: pa.Array) -> np.ndarray:
        """A (rows, width) float32 matrix from a scalar, array or vector column."""
        arr = _plain(arr)
        n = len(arr)
        if info.kind == "scalar":
            return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(n, 1)
        if info.kind == "vector":
            return self._vectors(info, cast(pa.StructArray, arr))  # column_kind: a vector is a struct
        lengths = (
            np.full(n, arr.type.list_size)
            if pa.types.is_fixed_size_list(arr.type)
            else pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        )
        width = self._check_widths(info, lengths)
        values = cast(_ListArray, arr).flatten().to_numpy(zero_copy_only=False)  # kind "array": a list column
        return np.asarray(values, dtype=np.float32).reshape(n, width)

    def _check_widths(self, info: ColumnInfo, lengths: np.ndarray) -> int:
        if len(lengths) == 0:
            return info.width or 0
        if info.width is None:
            info.width = int(lengths[0])
        bad = np.nonzero(lengths != info.width)[0]
        if len(bad):
            i = int(bad[0])
            because = (
                f"feature_shape {self.feature_shape} needs {info.width} values per row"
                if self.feature_shape and len(self.features) == 1
                else f"earlier rows hold {info.width} values"
            )
            raise DataError(
                f"column {info.name!r} is ragged: row {self.rows_seen + i} of this worker's data holds "
                f"{int(lengths[i])} values, but {because}. Make every row the same length "
                "(pad or filter), or fix feature_shape."
            )
        return info.width

    def _vectors(self, info: ColumnInfo, arr: pa.StructArray) -> np.ndarray:
        """Densify Spark ML vectors: type 1 = dense (values only), 0 = sparse (size, indices, values)."""
        fields = dict(
            zip([arr.type.field(i).name for i in range(arr.type.num_fields)], arr.flatten(), strict=True)
        )
        n = len(arr)
        kinds = fields["type"].to_numpy(zero_copy_only=False)
        values = cast(_ListArray, fields["values"])  # Spark ML's VectorUDT: values and indices are lists
        lengths = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        sizes = fields["size"].fill_null(-1).to_numpy(zero_copy_only=False)
        widths = np.where(kinds == 1, lengths, sizes)
        width = self._check_widths(info, widths)
        flat = np.asarray(values.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
        rows = np.repeat(np.arange(n), lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        cols = np.arange(len(flat)) - np.repeat(starts, lengths)
        sparse = kinds[rows] == 0
        if sparse.any():
            cols[sparse] = cast(_ListArray, fields["indices"]).flatten().to_numpy(zero_copy_only=False)
        out = np.zeros((n, width), dtype=np.float32)
        out[rows, cols] = flat
        return out

    def _images(self, info: ColumnInfo, arr: pa.Array) -> np.ndarray:
        from PIL import Image, UnidentifiedImageError

        blobs = cast(list[bytes], _plain(arr).to_pylist())  # _handle_nulls has dropped or refused null rows
        if info.image_shape is None and self.feature_shape is not None:
            shape = self.feature_shape if len(self.feature_shape) == 3 else (1,) + self.feature_shape
            if len(shape) != 3 or shape[0] not in _IMAGE_MODES:
                raise DataError(
                    f"feature_shape {self.feature_shape} does not fit image column {info.name!r}: "
                    "give (channels, height, width) with 1, 3 or 4 channels, or (height, width)."
                )
            c, h, w = shape
            info.image_shape = (c, h, w)
        out = None
        for i, blob in enumerate(blobs):
            try:
                img = Image.open(io.BytesIO(blob))
                img.load()
            except (UnidentifiedImageError, OSError, ValueError) as exc:
                raise DataError(
                    f"image column {info.name!r}: row {self.rows_seen + i} of this worker's data is not "
                    f"a readable image ({len(blob)} bytes: {exc}). Supported: PNG and JPEG; remove or "
                    "re-encode that row."
                ) from exc
            if info.image_shape is None:
                channels = {"L": 1, "RGB": 3, "RGBA": 4}.get(img.mode, 3)
                info.image_shape = (channels, img.height, img.width)
            c, h, w = info.image_shape
            if (img.height, img.width) != (h, w):
                raise DataError(
                    f"image column {info.name!r}: row {self.rows_seen + i} is {img.width}x{img.height} "
                    f"but images must all be {w}x{h}. Resize the images beforehand (or pass "
                    "feature_shape matching them)."
                )
            pixels = np.asarray(img.convert(_IMAGE_MODES[c]), dtype=np.float32) / 255.0
            if out is None:
                out = np.empty((len(blobs), c, h, w), dtype=np.float32)
            out[i] = pixels.reshape(h, w, c).transpose(2, 0, 1)
        if out is None:
            c, h, w = info.image_shape or (1, 0, 0)
            out = np.empty((0, c, h, w), dtype=np.float32)
        if self.feature_shape is not None and len(self.feature_shape) == 2:
            out = out.reshape((len(out),) + self.feature_shape)
        return out

    # ---------------------------------------------------------------- description
    def feature_shape_per_row(self) -> tuple[int, ...] | None:
        first = self.features[0]
        if first.kind == "image":
            return self.feature_shape or first.image_shape
        if self.feature_shape is not None:
            return self.feature_shape
        widths = [c.width for c in self.features if c.width is not None]
        return None if len(widths) < len(self.features) else (sum(widths),)

    def layout(self) -> dict[str, Any]:
        """Which columns became which tensor with which per-row shape (None: not yet seen)."""

        def col(c: ColumnInfo) -> dict[str, Any]:
            return {
                "name": c.name,
                "kind": c.kind,
                "type": c.arrow_type,
                "values_per_row": math.prod(c.image_shape) if c.image_shape else c.width,
            }

        out: dict[str, Any]
        if self.dict_batches:
            out = {
                f"features[{c.name!r}]": {
                    "columns": [col(c)],
                    "dtype": "int64" if c.name in self.integer else "float32",
                    "shape": c.image_shape
                    if c.kind == "image"
                    else ()
                    if c.kind == "scalar"
                    else (c.width,)
                    if c.width
                    else None,
                }
                for c in self.features
            }
        else:
            out = {
                "features": {
                    "columns": [col(c) for c in self.features],
                    "dtype": "float32",
                    "shape": self.feature_shape_per_row(),
                }
            }
        if self.label is not None:
            shape = () if self.label.kind == "scalar" else ((self.label.width,) if self.label.width else None)
            out["labels"] = {
                "columns": [col(self.label)],
                "dtype": str(self.label_dtype).replace("torch.", ""),
                "shape": shape,
            }
        return out

    def describe(self) -> str:
        """One line for the log, e.g. ``features float32 (batch, 1, 28, 28) <- 'pixels' (list<float>, 784/row)``."""

        def part(entry: dict[str, Any]) -> str:
            shape = entry["shape"]
            dims = "(batch, ?)" if shape is None else "(batch" + "".join(f", {d}" for d in shape) + ")"
            cols = ", ".join(
                f"{c['name']!r} ({c['kind']} {c['type']}, "
                f"{c['values_per_row'] if c['values_per_row'] is not None else '?'}/row)"
                for c in entry["columns"]
            )
            return f"{entry['dtype']} {dims} <- {cols}"

        return "; ".join(f"{name} {part(entry)}" for name, entry in self.layout().items())


def _integer_values(t: pa.DataType) -> bool:
    """Whether a column holds integers (a scalar or the values of an array)."""
    return pa.types.is_integer(t.value_type if _is_list(t) else t)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory, without a copy.

    Zero-copy numpy views of Arrow buffers are flagged read-only, which
    ``torch.from_numpy`` warns about. The buffers were decoded for this batch alone
    (from Parquet or from Spark's Arrow stream) and nothing else reads them, so the
    tensor may own them: DLPack hands them over without the copy (a 16 MB record
    batch costs ~1.3 ms per copy, a sizeable share of the whole pipeline)."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    try:
        return torch.from_dlpack(array)
    except (BufferError, TypeError, RuntimeError):  # numpy too old to export read-only arrays
        return torch.from_numpy(array.copy())


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _valid_rows(arr: pa.Array, kind: str) -> np.ndarray | None:
    """A boolean mask of rows without nulls (None when all rows are fine)."""
    arr = _plain(arr)
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
    child = None
    if kind == "array":
        child = arr
    elif kind == "vector":
        struct = cast(pa.StructArray, arr)
        child = struct.flatten()[
            [struct.type.field(i).name for i in range(struct.type.num_fields)].index("values")
        ]
    if child is not None and len(child) and cast(_ListArray, child).flatten().null_count:
        inner = cast(_ListArray, child).flatten()
        parents = pc.list_parent_indices(child).to_numpy(zero_copy_only=False)
        bad_rows = np.unique(parents[~inner.is_valid().to_numpy(zero_copy_only=False)])
        valid = np.ones(len(arr), bool) if valid is None else valid.copy()
        valid[bad_rows] = False
    return valid
