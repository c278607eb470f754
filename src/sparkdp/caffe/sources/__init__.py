"""Train a Caffe net from the data its ``Data`` / ``HDF5Data`` layer names, read where it lives.

A Caffe train/test net names its data: ``data_param { source: "mnist_train_lmdb"
backend: LMDB }`` (a database of serialized ``Datum`` records, ``caffe/datum.py``) or
``hdf5_data_param { source: "train.txt" }`` (a text file listing ``.h5`` files).
``sparkdp train --caffe-net NET --caffe-solver SOLVER`` without ``--dataset``/``--data``
(and ``fit_caffe(net, solver)`` without ``data``) read those sources with the
:class:`CaffeDataSource` :class:`~sparkdp.data.base.WorkerData` subclasses: the
TRAIN-phase layer's source for training, the TEST-phase one for evaluation.  This package
finds the layers and builds their sources (:func:`net_data`); ``records.py`` holds the
WorkerData classes and the sharding, ``transform.py`` Caffe's ``DataTransformer``, and
``backends.py`` the LMDB/LevelDB/HDF5 access and the optional packages.

Where the data is read.  Like ``data/parquet.py``, nothing is copied or collected: the
driver opens the source once to count the records, note block boundaries and decode the
first record (its shape builds the net and is checked against the TEST source's), and
every Spark task opens the database or files itself.  A source object holds paths and
small indexes only, so it pickles into each task cheaply.

How records are assigned to ranks: as ``data/parquet.py`` assigns rows (a seeded
permutation per epoch, contiguous ranges per rank, the last rank wrapping around, a shuffle
buffer seeded by (seed, epoch, rank)), with *blocks* of ``block_rows`` consecutive records in
storage order (key order for LMDB/LevelDB, row order for HDF5) in place of row groups.
The driver enumerates the keys once and keeps only each block's first key (N / 256 keys
for the default; ``block_rows=1`` keeps every key and gives a per-record permutation read
by key).  A rank reads its blocks sequentially from their first key (a cursor scan, which
is what databases and disks are fast at, rather than one random ``get`` per record); its
shuffle buffer holds about 64 MiB of transformed rows.  Evaluation reads every record
exactly once: rank ``r`` takes ``[r * n // W, (r + 1) * n // W)`` in storage order.
Caffe's own ``Data`` layer reads in key order without shuffling (databases are shuffled
when written: ``convert_imageset --shuffle``); sparkdp shuffles a ``Data`` layer's records unless ``shuffle=False``, and an
``HDF5Data`` layer's only when it says ``hdf5_data_param { shuffle: true }``, as Caffe does.

``transform_param`` is applied on the workers as Caffe's ``DataTransformer`` does
(``transform.py``), with its random choices seeded by (seed, epoch, rank); the
:class:`~sparkdp.caffe.classifier.CaffeClassifier` is then built with
``apply_transform=False`` so nothing is applied twice.  ``HDF5Data`` has no transformation
(Caffe refuses ``transform_param`` there); its datasets are read as float32, named by the
layer's tops.

Paths.  A relative ``source`` (and ``mean_file``) is looked up from the working directory,
as Caffe does, then from the prototxt's directory; the paths in an HDF5 list likewise from
the working directory, then from the list's directory.  They are made absolute on the
driver, since Spark tasks run in other directories.

Backends (optional packages, locking): see ``backends.py``.

Example (``net_data("lenet_train_test.prototxt")`` gives a net's TRAIN and TEST sources):
    >>> import tempfile
    >>> import numpy as np
    >>> tmp = tempfile.TemporaryDirectory()
    >>> write_datum_db(f"{tmp.name}/db", np.zeros((5, 1, 2, 2), np.uint8), [0, 1, 2, 3, 4])
    5
    >>> source = DatumDBSource(f"{tmp.name}/db", block_rows=2)
    >>> source.describe()
    "LMDB '...db': 5 Datum records 1×2×2 uint8 in 3 blocks of 2; TRAIN transform: none"
    >>> [y.tolist() for _, y in source.eval_batches(rank=1, world_size=2, batch_size=2)]
    [[2, 3], [4]]
    >>> tmp.cleanup()
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DataError
from ..spec import LayerSpec, NetSpec, NetState, filter_layers, is_prototxt_path, load_net_spec
from ..textformat import Message
from .backends import detect_backend, resolve_path, write_datum_db, write_hdf5_source
from .records import DEFAULT_BLOCK_ROWS, CaffeDataSource, DatumDBSource, HDF5Source
from .transform import DatumTransform, read_mean_file

__all__ = [
    "CaffeDataSource", "DatumDBSource", "DatumTransform", "HDF5Source", "NetData", "net_data", "read_mean_file",
    "source_for_layer", "write_datum_db", "write_hdf5_source",
]  # fmt: skip

log = logging.getLogger(__name__)

# Losses (and Accuracy) that read class indices: their labels become int64 (Caffe casts them to int).
CLASS_LABEL_LAYERS = ("SoftmaxWithLoss", "MultinomialLogisticLoss", "InfogainLoss", "HingeLoss", "Accuracy")


@dataclass
class NetData:
    """A net's own training and evaluation data (see :func:`net_data`).

    Attributes:
        train, eval: the TRAIN- and TEST-phase layers' sources (``eval`` None without a TEST layer).
        sample_shape: one transformed row, the net's input shape without the batch.
        fed_shapes: shapes of the other fed tops to build the net with (HDF5Data labels).
        data_top, label_top: the tops the sources feed.
    """

    train: CaffeDataSource
    eval: CaffeDataSource | None
    sample_shape: tuple[int, ...]
    fed_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    data_top: str = "data"
    label_top: str | None = "label"

    def check_model(self, model: Any) -> None:
        """The built classifier must feed what the sources read (data top, label top)."""
        if model.data_blob != self.data_top or (self.label_top and model.label_blob != self.label_top):
            raise ConfigError(
                f"the net feeds {model.data_blob!r} as data and {model.label_blob!r} as label, but its data layer "
                f"{self.train.layer} produces {self.data_top!r} and {self.label_top!r}; sparkdp feeds the layer's "
                "first top as the data and its second as the label."
            )

    def describe(self) -> str:
        return self.train.describe() + (f"; eval: {self.eval.describe()}" if self.eval is not None else "")


def _source_layers(spec: NetSpec, phase: str) -> tuple[LayerSpec | None, list[LayerSpec]]:
    from ..layers.data import SOURCE_TYPES

    layers = filter_layers(spec, NetState(phase)).layers
    readable = [layer for layer in layers if layer.type in ("Data", "HDF5Data")]
    if len(readable) > 1:
        raise ConfigError(
            f"the net's {phase} phase has {len(readable)} data layers "
            f"({', '.join(f'{layer.name!r} ({layer.where})' for layer in readable)}); sparkdp reads the source of "
            "one. Keep one per phase, or give the data explicitly (--dataset / --data)."
        )
    others = [
        layer for layer in layers if layer.type in SOURCE_TYPES and layer.type not in ("Data", "HDF5Data")
    ]
    return (readable[0] if readable else None), others


def _class_labels(spec: NetSpec, label_top: str | None) -> bool:
    if label_top is None:
        return True
    return any(layer.type in CLASS_LABEL_LAYERS and label_top in layer.bottoms[1:2] for layer in spec.layers)


def source_for_layer(
    layer: LayerSpec,
    phase: str,
    *,
    base_dirs: Sequence[Path] = (),
    class_labels: bool = True,
    limit: int | None = None,
    shuffle_buffer: int | None = None,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> CaffeDataSource:
    """The :class:`CaffeDataSource` a ``Data`` or ``HDF5Data`` layer reads."""
    where = f"{layer.where}: {layer.describe()}"
    if layer.type == "Data":
        param = layer.sub("data_param")
        source = str(param.get("source", "") or "")
        if not source:
            raise ConfigError(f"{where}: data_param has no source; name the LMDB/LevelDB to read.")
        stated = param.get("backend")
        path = resolve_path(
            source,
            base_dirs,
            "data_param source",
            where,
            "Create it (Caffe's convert_imageset / convert_mnist_data, or sparkdp.caffe.sources.write_datum_db), "
            "fix the path, or train from other data (--dataset / --data).",
        )
        if stated is None:
            detected = detect_backend(path)
            if detected == "lmdb":
                log.info(
                    "%s: no backend given (Caffe's default is LEVELDB); %s holds an LMDB, reading it as one",
                    where,
                    path,
                )
            backend = detected or "leveldb"
        else:
            backend = str(stated).lower()
        return DatumDBSource(
            path,
            backend=backend,
            transform=DatumTransform.from_layer(layer, phase, base_dirs),
            class_labels=class_labels,
            limit=limit,
            shuffle=True,
            shuffle_buffer=shuffle_buffer,
            block_rows=block_rows,
            layer=where,
            phase=phase,
        )
    if layer.type == "HDF5Data":
        param = layer.sub("hdf5_data_param")
        source = str(param.get("source", "") or "")
        if not source:
            raise ConfigError(
                f"{where}: hdf5_data_param has no source; name the text file listing the .h5 files."
            )
        path = resolve_path(
            source,
            base_dirs,
            "hdf5_data_param source",
            where,
            "It must be a text file listing the .h5 files, one per line.",
        )
        tops = layer.tops
        return HDF5Source(
            path,
            data_top=tops[0],
            label_top=tops[1] if len(tops) > 1 else None,
            class_labels=class_labels,
            shuffle=bool(param.get("shuffle", False)),
            limit=limit,
            shuffle_buffer=shuffle_buffer,
            block_rows=block_rows,
            layer=where,
            phase=phase,
        )
    raise ConfigError(f"{where}: sparkdp reads the sources of Data and HDF5Data layers, not {layer.type}.")


def net_data(
    net: str | os.PathLike[str] | Message | NetSpec,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    shuffle_buffer: int | None = None,
    block_rows: int = DEFAULT_BLOCK_ROWS,
) -> NetData:
    """The training and evaluation data a net's TRAIN- and TEST-phase data layers name.

    Args:
        net: the net prototxt (path, text, Message or NetSpec).
        base_dir: where relative sources are looked for after the working directory;
            default: the prototxt's directory when ``net`` is a path.
        limit: read only the first ``limit`` records of each source.
        shuffle_buffer, block_rows: see :class:`DatumDBSource`.

    Raises:
        ConfigError: no Data/HDF5Data layer in the TRAIN phase, or a source that cannot be used.
        DataError: a missing or unreadable source, or records that disagree in shape.
    """
    if base_dir is None and is_prototxt_path(net):
        base_dir = Path(net).parent
    spec = load_net_spec(net)
    base_dirs = [Path(base_dir)] if base_dir is not None else []
    train_layer, others = _source_layers(spec, "TRAIN")
    if train_layer is None:
        found = ", ".join(f"{layer.name!r} ({layer.type})" for layer in others) or "none"
        raise ConfigError(
            f"the net {spec.name!r} has no Data or HDF5Data layer in its TRAIN phase (data layers: {found}), so "
            "there is no source to read; give the training data (--dataset NAME or --data PATH.parquet; "
            "fit_caffe(..., data=...))."
        )
    label_top = train_layer.tops[1] if len(train_layer.tops) > 1 else None
    class_labels = _class_labels(spec, label_top)
    options: dict[str, Any] = dict(
        base_dirs=base_dirs,
        class_labels=class_labels,
        limit=limit,
        shuffle_buffer=shuffle_buffer,
        block_rows=block_rows,
    )
    train = source_for_layer(train_layer, "TRAIN", **options)
    test_layer, _ = _source_layers(spec, "TEST")
    evaluation = source_for_layer(test_layer, "TEST", **options) if test_layer is not None else None
    if test_layer is None:
        log.info("the net has no Data/HDF5Data layer in its TEST phase: training without evaluation")
    if evaluation is not None and evaluation.sample_shape != train.sample_shape:
        raise DataError(
            f"the TEST source ({evaluation.describe()}) gives rows of shape {evaluation.sample_shape} but the net's "
            f"input, built from the TRAIN source ({train.describe()}), is {train.sample_shape}; both phases must "
            "feed the same shape (same image size, or the same crop_size)."
        )
    fed: dict[str, tuple[int, ...]] = {}
    if isinstance(train, HDF5Source) and label_top is not None:
        batch = int(train_layer.sub("hdf5_data_param").get("batch_size", 1) or 1)
        fed[label_top] = (batch, *train.label_row_shape())
        if (
            evaluation is not None
            and isinstance(evaluation, HDF5Source)
            and evaluation.label_row_shape() != train.label_row_shape()
        ):
            raise DataError(
                f"the TEST labels {label_top!r} have rows of shape {evaluation.label_row_shape()} but the TRAIN ones "
                f"{train.label_row_shape()}; store them alike."
            )
    return NetData(train, evaluation, tuple(train.sample_shape), fed, train_layer.tops[0], label_top)
