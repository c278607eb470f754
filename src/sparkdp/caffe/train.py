"""Train a Caffe net with its own solver on sparkdp: the bridge to :func:`sparkdp.fit`.

sparkdp's training loop calls ``model(x)`` and ``loss_fn(out, y)``; a Caffe net instead
takes ``data`` and ``label`` and ends in its loss layer.  This module adapts one to the
other without touching the net's semantics:

* :class:`~sparkdp.caffe.classifier.CaffeClassifier` (``caffe/classifier.py``) builds the
  layers the prediction depends on and applies the Data layer's ``transform_param``;
  :class:`~sparkdp.caffe.classifier.CaffeLoss` is the net's loss layer times its ``loss_weight``.
* :class:`~sparkdp.caffe.solver.CaffeOptimizerFactory` (``caffe/solver.py``)
  rebuilds the solver's optimizer on every worker, with the ``lr_policy`` and
  ``clip_gradients`` attached as optimizer step hooks.
* :func:`fit_caffe` puts them together: solver + net (+ initial ``.caffemodel``) in,
  :class:`~sparkdp.train.result.TrainResult` out.  Without ``data`` it trains from the
  sources the net's own TRAIN/TEST Data or HDF5Data layers name (LMDB, LevelDB, HDF5 lists),
  read on the workers with the layer's ``transform_param`` applied there (``caffe/sources/``).

Solver settings and how they map: ``type``/``base_lr``/``momentum``/``weight_decay``/
``regularization_type``/``lr_policy`` and its parameters as in Caffe; ``max_iter`` sets
the number of epochs (rounded up to whole epochs) unless ``epochs`` is given;
``iter_size: k`` becomes a k times larger per-worker batch (the same averaged gradient for
per-sample losses; BatchNorm statistics then see the larger batch) with the clipping
threshold applied as Caffe does to the un-normalized sum; ``solver_mode``/``device_id`` are
ignored (each worker trains on sparkdp's device); ``test_interval``/``test_iter`` are
replaced by sparkdp's evaluation after every epoch; ``snapshot`` is not taken mid-run (save
the final weights with :func:`~sparkdp.caffe.weights.save_weights`).

Example:
    >>> result = fit_caffe("lenet_train_test.prototxt", "lenet_solver.prototxt",
    ...                    "fashion-mnist", workers=2, epochs=1)            # doctest: +SKIP
    >>> save_weights(result.model, "lenet.caffemodel")                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .classifier import CaffeClassifier
from .solver import CaffeOptimizerFactory
from .solver_spec import SolverSpec, read_solver_spec
from .spec import is_prototxt_path

__all__ = [
    "build_model", "data_sample_shape", "effective_batch_size", "fit_caffe", "net_sources", "plan_epochs",
    "plan_run", "solver_net_source",
]  # fmt: skip

log = logging.getLogger(__name__)


def solver_net_source(spec: SolverSpec, solver_path: str | os.PathLike[str] | None = None) -> Any:
    """The train net a solver names: ``train_net_param``/``net_param`` inline, or a path.

    A relative ``net:``/``train_net:`` path is tried from the working directory (as Caffe
    does), then from the solver file's directory.
    """
    inline = spec.train_net_param or spec.net_param
    if inline is not None:
        return inline
    path = spec.train_net or spec.net
    if not path:
        raise ConfigError(
            "the solver names no net (no net:, train_net: or net_param); pass the net prototxt "
            "(--caffe-net NET.prototxt)."
        )
    candidates = [Path(path)]
    if solver_path is not None and not Path(path).is_absolute():
        candidates.append(Path(solver_path).parent / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"the solver's net {path!r} was not found (tried {', '.join(repr(str(c)) for c in candidates)}); "
        "pass the net prototxt explicitly (--caffe-net NET.prototxt), which takes precedence."
    )


def data_sample_shape(data: Any) -> tuple[int, ...] | None:
    features = getattr(data, "features", None)
    if features is None and isinstance(data, tuple) and len(data) == 2:
        features = data[0]
    shape = getattr(features, "shape", None)
    return tuple(int(d) for d in shape[1:]) if shape is not None and len(shape) > 1 else None


def _note_ignored(spec: SolverSpec) -> None:
    if spec.solver_mode == "GPU":
        log.info(
            "Caffe solver: solver_mode GPU is ignored; each worker trains on sparkdp's device "
            "(the CPU here unless CUDA is available)"
        )
    ignored = [
        f"{name} {getattr(spec, name)}"
        for name in ("test_interval", "snapshot", "display")
        if getattr(spec, name)
    ]
    if ignored:
        log.info(
            "Caffe solver: %s not used (sparkdp evaluates after every epoch; save the final weights "
            "with --out / save_weights)",
            ", ".join(ignored),
        )


def plan_epochs(spec: SolverSpec, batch_size: int, workers: int, rows: int | None) -> int:
    """Epochs covering the solver's ``max_iter`` global batches (rounded up, at least 1)."""
    if spec.max_iter <= 0 or not rows:
        return 1
    epochs = max(1, math.ceil(spec.max_iter * batch_size * workers / rows))
    log.info(
        "Caffe solver: max_iter %d x %d rows per step (%d workers x %d) over %d rows -> %d epoch(s); "
        "pass epochs to override",
        spec.max_iter,
        batch_size * workers,
        workers,
        batch_size,
        rows,
        epochs,
    )
    return epochs


def plan_run(
    spec: SolverSpec,
    batch_size: int,
    workers: int | None,
    rows: int | None,
    *,
    master: str | None = None,
    spark: Any = None,
) -> tuple[int, int, Any]:
    """``(workers, epochs, spark)``; ``workers`` None is the task slots of ``spark`` or ``master`` (2 if unknown)."""
    if workers is None:
        from ..spark.cluster import task_slots
        from ..spark.session import session

        spark = spark or session(master)
        workers = task_slots(spark) or 2
    return workers, plan_epochs(spec, batch_size, workers, rows), spark


def fit_caffe(
    net: Any,
    solver: Any,
    data: Any = None,
    *,
    weights: str | os.PathLike[str] | None = None,
    eval_data: Any = None,
    sample_shape: Sequence[int] | None = None,
    raw_scale: float | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
    seed: int = 0,
    master: str | None = None,
    spark: Any = None,
    **fit_options: Any,
) -> Any:
    """Train a Caffe net with its solver data-parallel on Spark; returns a ``TrainResult``.

    Args:
        net: the net prototxt (path, text, Message or NetSpec); None takes the solver's
            ``net``/``train_net``.
        solver: the solver prototxt (path, text, Message or :class:`SolverSpec`).
        data: as for :func:`sparkdp.fit`; a built-in dataset name feeds its training split
            and evaluates on its test split; None reads the source of the net's TRAIN-phase
            Data/HDF5Data layer (and evaluates on the TEST-phase one's), relative paths from
            the working directory, then from the prototxt's directory.
        eval_data: as for :func:`sparkdp.fit`.
        weights: a ``.caffemodel`` to start from (all its layers must fit).
        sample_shape: one row's shape; default: taken from array/tensor data.
        raw_scale: see :class:`CaffeClassifier`; default 255 for built-in datasets
            (images in [0, 1]), else 1.
        epochs: default: enough epochs for the solver's ``max_iter``.
        batch_size: per-worker rows per step; default: the data layer's ``batch_size``
            (times the solver's ``iter_size``).
        fit_options: passed to :func:`sparkdp.fit` (strategy, threads, ...).

    The trained weights are in ``result.model`` (a :class:`CaffeClassifier`);
    ``save_weights(result.model, path)`` writes them as a ``.caffemodel``.
    """
    from ..data.datasets import Dataset as BuiltinDataset
    from ..data.datasets import load_dataset
    from ..data.tensors import TensorData
    from ..driver.api import fit

    spec = read_solver_spec(solver)
    solver_path = solver if isinstance(solver, (str, os.PathLike)) and os.path.isfile(solver) else None
    if net is None:
        net = solver_net_source(spec, solver_path)
    sources = None
    if data is None:
        sources = net_sources(net, solver_path, sample_shape)
        data = sources.train
        eval_data = sources.eval if eval_data is None else eval_data
        sample_shape, raw_scale = sources.sample_shape, 1.0
    if isinstance(data, str):
        data = load_dataset(data)
    if isinstance(data, BuiltinDataset):
        raw_scale = 255.0 if raw_scale is None else raw_scale
        if eval_data is None:
            eval_data = TensorData(data.x_test, data.y_test)
        data = TensorData(data.x_train, data.y_train)
    model = build_model(
        net,
        spec,
        sample_shape=sample_shape or data_sample_shape(data),
        raw_scale=1.0 if raw_scale is None else raw_scale,
        weights=weights,
        seed=seed,
        sources=sources,
    )
    batch = effective_batch_size(model, spec, batch_size)
    if epochs is None:
        rows = data.num_samples() if hasattr(data, "num_samples") else _rows(data)
        workers, epochs, spark = plan_run(spec, batch, workers, rows, master=master, spark=spark)
    return fit(
        model,
        data,
        eval_data=eval_data,
        loss=model.caffe_loss(),
        optimizer=CaffeOptimizerFactory(spec, model),
        epochs=epochs,
        batch_size=batch,
        workers=workers,
        seed=seed,
        master=master,
        spark=spark,
        **fit_options,
    )


def net_sources(
    net: Any, solver_path: Any = None, sample_shape: Sequence[int] | None = None, limit: int | None = None
) -> Any:
    """The :class:`~sparkdp.caffe.sources.NetData` of a net's own data layers.

    Relative sources are looked up from the working directory, then from the net prototxt's
    directory (the solver's for a net inline in the solver).  A given ``sample_shape`` must
    match the records'.
    """
    from .sources import net_data

    base = None
    if is_prototxt_path(net):
        base = Path(net).parent
    elif solver_path is not None:
        base = Path(solver_path).parent
    sources = net_data(net, base_dir=base, limit=limit)
    if sample_shape is not None and tuple(int(d) for d in sample_shape) != tuple(sources.sample_shape):
        raise ConfigError(
            f"sample_shape {tuple(sample_shape)} does not match the rows the net's data layer feeds "
            f"({tuple(sources.sample_shape)} from {sources.train.describe()}); leave sample_shape out."
        )
    log.info("Caffe data: %s", sources.describe())
    return sources


def _rows(data: Any) -> int | None:
    try:
        return len(data[0]) if isinstance(data, tuple) else len(data)
    except TypeError:
        return None


def build_model(
    net: Any,
    spec: SolverSpec,
    *,
    sample_shape: Sequence[int] | None,
    raw_scale: float,
    weights: str | os.PathLike[str] | None = None,
    seed: int = 0,
    apply_transform: bool = True,
    input_shapes: dict[str, Sequence[int]] | None = None,
    sources: Any = None,
) -> CaffeClassifier:
    """The :class:`CaffeClassifier` to train (fillers seeded by ``seed``), with initial weights if given.

    ``apply_transform=False`` when the data comes transformed (the net's own sources,
    ``caffe/sources/``); ``input_shapes`` gives the shapes of other fed tops (HDF5Data labels).
    With ``sources`` (the net's own, :func:`net_sources`) the model takes their sample and fed
    shapes, leaves the transform to them, and is checked against them.
    """
    from .weights import load_weights

    if sources is not None:
        sample_shape, apply_transform = sources.sample_shape, False
        input_shapes = {**sources.fed_shapes, **(input_shapes or {})}
    _note_ignored(spec)
    torch.manual_seed(seed)
    model = CaffeClassifier(
        net,
        sample_shape=sample_shape,
        raw_scale=raw_scale,
        apply_transform=apply_transform,
        input_shapes=input_shapes,
    )
    if weights is not None:
        summary = load_weights(model, weights)
        log.info(
            "loaded %s: layers %s%s",
            weights,
            ", ".join(summary.loaded),
            f" (ignored file layers: {', '.join(summary.ignored)})" if summary.ignored else "",
        )
    if sources is not None:
        sources.check_model(model)
    return model


def effective_batch_size(model: CaffeClassifier, spec: SolverSpec, batch_size: int | None) -> int:
    """Per-worker rows per step: ``batch_size`` or the data layer's, times ``iter_size``."""
    base = batch_size if batch_size is not None else (model.batch_size or 64)
    if spec.iter_size > 1:
        log.info(
            "Caffe solver: iter_size %d -> per-worker batch %d x %d = %d (gradients averaged over the "
            "larger batch, as Caffe's accumulation does)",
            spec.iter_size,
            base,
            spec.iter_size,
            base * spec.iter_size,
        )
    return base * spec.iter_size
