"""Train a Caffe net with its own solver on sparkdp: the bridge to :func:`sparkdp.fit`.

sparkdp's training loop calls ``model(x)`` and ``loss_fn(out, y)``; a Caffe net instead
takes ``data`` and ``label`` and ends in its loss layer.  This module adapts one to the
other without touching the net's semantics:

* :class:`CaffeClassifier` builds the layers the prediction depends on (the first
  bottom of the net's loss layer, e.g. LeNet's ``ip2``), applies the Data layer's
  ``transform_param`` (``(x * raw_scale - mean_value) * scale``) to what sparkdp feeds,
  and returns that blob.  It keeps Caffe's view of itself (``caffe_layers``,
  ``blobs_of``, ``param_groups``), so :func:`~sparkdp.caffe.weights.load_weights`,
  :func:`~sparkdp.caffe.weights.save_weights` and ``load_solver`` work on it.
* :class:`CaffeLoss` is the net's loss layer (the converter's own module: SoftmaxWithLoss
  normalization and ignore_label, EuclideanLoss, ...) times its ``loss_weight``.
* :class:`CaffeOptimizerFactory` rebuilds, on every worker's copy of the model, the
  solver's optimizer over the ``lr_mult``/``decay_mult`` parameter groups, with the
  ``lr_policy`` and ``clip_gradients`` attached as optimizer step hooks
  (:class:`CaffeSolverHooks`).  The iteration counter lives in the optimizer's param
  groups, so it survives ``optimizer.state_dict()`` round trips, and the same optimizer
  serves asynchronous strategies as their worker optimizer.
* :func:`fit_caffe` puts them together: solver + net (+ initial ``.caffemodel``) in,
  :class:`~sparkdp.train.result.TrainResult` out.

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

import dataclasses
import logging
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer

from ..errors import ConfigError
from .layers import CONVERTERS, BuildContext
from .layers.data import SOURCE_TYPES
from .lr_policy import advance_current_step, learning_rate
from .net import CaffeNet
from .optim import make_optimizer
from .solver_spec import SolverSpec, read_solver_spec
from .spec import LayerSpec, NetSpec, NetState, filter_layers, load_net_spec
from .textformat import Message

__all__ = [
    "CaffeClassifier",
    "CaffeLoss",
    "CaffeOptimizerFactory",
    "CaffeSolverHooks",
    "fit_caffe",
    "solver_net_source",
]

log = logging.getLogger(__name__)

# Where each image-record source keeps its batch_size.
_BATCH_PARAM = {"Data": "data_param", "ImageData": "image_data_param", "MemoryData": "memory_data_param",
                "HDF5Data": "hdf5_data_param"}  # fmt: skip


def _loss_weights(layer: LayerSpec) -> list[float]:
    """Caffe's per-top loss weights (``*Loss`` layers default to 1 on their first top)."""
    if layer.loss_weights:
        return [float(w) for w in layer.loss_weights]
    return [1.0] + [0.0] * (len(layer.tops) - 1) if layer.type.endswith("Loss") else []


def _prototxt_batch(layer: LayerSpec) -> int | None:
    """The batch size a data layer states, if any."""
    if layer.type in _BATCH_PARAM:
        value = layer.sub(_BATCH_PARAM[layer.type]).get("batch_size")
        return int(value) if isinstance(value, int) and value > 0 else None
    return None


def _ancestors(layers: Sequence[LayerSpec], blob: str) -> tuple[list[LayerSpec], set[str]]:
    """The layers (in file order) ``blob``'s final value depends on (in-place ones included), and their blobs."""
    needed, kept = {blob}, []
    for layer in reversed(layers):
        if needed & set(layer.tops):
            kept.append(layer)
            needed |= set(layer.bottoms)
    return kept[::-1], needed


class CaffeLoss(nn.Module):
    """``loss(prediction, labels)``: the net's loss layer applied as Caffe does.

    The value is ``Σ loss_weight × sum(top)`` over the layer's tops, computed by the
    layer converter's own module (e.g. SoftmaxWithLoss with its ``normalization`` and
    ``ignore_label``).  Picklable; no parameters.
    """

    def __init__(self, layer: nn.Module, weights: Sequence[float], name: str = "") -> None:
        super().__init__()
        self.layer = layer
        self.weights = [float(w) for w in weights]
        self.name = name

    def forward(self, prediction: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        tops = self.layer(prediction, labels)
        total = prediction.new_zeros(())
        for top, weight in zip(tops, self.weights, strict=False):
            if weight:
                total = total + weight * top.sum()
        return total


class CaffeClassifier(nn.Module):
    """A Caffe net seen by sparkdp as ``model(x) -> prediction`` (the loss layer's input).

    Args:
        net: a ``.prototxt`` path, its text, a parsed Message or a :class:`NetSpec`.
        phase, stages, level: the NetState to build (default TRAIN; ``eval()`` gives the
            TEST behaviour of Dropout/BatchNorm, as for :class:`CaffeNet`).
        sample_shape: the shape of one fed row, e.g. ``(1, 28, 28)``; needed for Data
            layers, whose records' shape the prototxt does not state.
        raw_scale: what the fed values are multiplied by to get Caffe's raw input (255 for
            images scaled to [0, 1], like sparkdp's built-in datasets; 1 for raw pixels),
            as pycaffe's ``Transformer.set_raw_scale``.  The Data layer's
            ``transform_param`` ``mean_value`` and ``scale`` are then applied.

    The net must have exactly one loss layer, whose bottoms are the prediction and a
    label fed by a data layer, and one other fed input (the data).  The other fed tops
    (the label) are fed zeros, since only layers the prediction depends on are built.

    Attributes:
        net: the :class:`CaffeNet` of those layers.
        data_blob, label_blob, prediction_blob: the fed data, the loss's label, the output.
        batch_size: the data layer's ``batch_size`` (None when the prototxt states none).
    """

    def __init__(
        self,
        net: str | os.PathLike[str] | Message | NetSpec,
        *,
        phase: str = "TRAIN",
        stages: Sequence[str] = (),
        level: int = 0,
        sample_shape: Sequence[int] | None = None,
        raw_scale: float = 1.0,
    ) -> None:
        super().__init__()
        spec = net if isinstance(net, NetSpec) else load_net_spec(net)
        state = NetState(str(phase).upper(), int(level), tuple(stages))
        layers = filter_layers(spec, state).layers
        losses = [(i, layer) for i, layer in enumerate(layers) if any(_loss_weights(layer))]
        if len(losses) != 1:
            found = ", ".join(f"{layer.name!r} ({layer.type})" for _, layer in losses) or "none"
            raise ConfigError(
                f"sparkdp trains a Caffe net with exactly one loss layer in the {state.phase} phase; "
                f"net {spec.name!r} has {len(losses)}: {found}. Keep one loss (set loss_weight: 0 on "
                "the others, or remove them)."
            )
        index, loss = losses[0]
        if len(loss.bottoms) != 2:
            raise ConfigError(
                f"{loss.describe()} has {len(loss.bottoms)} bottoms; sparkdp needs (prediction, label)."
            )
        prediction, label = loss.bottoms
        head, needed = _ancestors(layers[:index], prediction)
        sources = [layer for layer in head if layer.type in SOURCE_TYPES]
        label_sources = [
            layer for layer in layers[:index] if layer.type in SOURCE_TYPES and label in layer.tops
        ]
        if not label_sources:
            raise ConfigError(
                f"{loss.describe()} reads label blob {label!r}, which no data layer produces; sparkdp feeds "
                "the labels to the loss, so the label must be a top of a Data/Input layer."
            )
        fed = [top for layer in sources for top in layer.tops if top in needed]
        if len(fed) != 1:
            raise ConfigError(
                f"the prediction {prediction!r} of {loss.describe()} depends on {len(fed)} fed blob(s) "
                f"{fed}; sparkdp feeds exactly one (the features)."
            )
        self.data_blob, self.label_blob, self.prediction_blob = fed[0], label, prediction
        source = next(layer for layer in sources if self.data_blob in layer.tops)
        self.batch_size = _prototxt_batch(source)
        shapes = None
        if sample_shape is not None:
            shapes = {self.data_blob: (self.batch_size or 1, *(int(d) for d in sample_shape))}
        self.net = CaffeNet(dataclasses.replace(spec, layers=head, state=state), state, shapes)
        self._zero_inputs = [n for n in self.net.input_names if n != self.data_blob]
        self.raw_scale = float(raw_scale)
        self.scale, mean = _transform(source)
        self.register_buffer("mean", None if mean is None else torch.tensor(mean), persistent=False)
        self._loss_layer, self._loss_weights = loss, _loss_weights(loss)
        self._loss_shapes = [self.net.blob_shapes[prediction], (self.net.blob_shapes[prediction][0],)]
        if label in self.net.blob_shapes:
            self._loss_shapes[1] = self.net.blob_shapes[label]
        self.caffe_loss()  # fail now, with the layer named, if the loss does not fit the prediction

    # ---------------------------------------------------------------- Caffe's view

    @property
    def caffe_layers(self) -> list[tuple[str, str]]:
        """``(name, type)`` of the built layers (what ``save_weights`` writes)."""
        return self.net.caffe_layers

    def blobs_of(self, layer_name: str) -> list[torch.Tensor]:
        """The layer's live tensors in Caffe blob order (what ``load_weights`` fills)."""
        return self.net.blobs_of(layer_name)

    def param_groups(self, base_lr: float, weight_decay: float = 0.0) -> list[dict[str, Any]]:
        """The net's ``lr_mult``/``decay_mult`` optimizer groups (see :meth:`CaffeNet.param_groups`)."""
        return self.net.param_groups(base_lr, weight_decay)

    def caffe_loss(self) -> CaffeLoss:
        """The net's loss layer as ``loss(prediction, labels)``, built by its converter."""
        loss = self._loss_layer
        built = CONVERTERS.get(loss.type).factory(loss, list(self._loss_shapes), BuildContext(self.net.phase))
        return CaffeLoss(built.module, self._loss_weights, loss.name)

    # -------------------------------------------------------------------- running

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Caffe's DataTransformer on fed values: ``(x * raw_scale - mean_value) * scale``."""
        if not x.is_floating_point():
            x = x.float()
        if self.raw_scale != 1.0:
            x = x * self.raw_scale
        if self.mean is not None:
            x = x - self.mean.to(x.dtype)
        if self.scale != 1.0:
            x = x * self.scale
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.transform(x)
        inputs = {self.data_blob: x}
        for name in self._zero_inputs:  # the label: its layers are not built, so its value is unused
            inputs[name] = x.new_zeros((x.shape[0], *self.net.input_shapes[name][1:]))
        out = self.net(**inputs)
        return out[self.prediction_blob] if isinstance(out, dict) else out

    def extra_repr(self) -> str:
        return (
            f"data={self.data_blob!r} -> prediction={self.prediction_blob!r}, loss={self._loss_layer.name!r} "
            f"({self._loss_layer.type}), raw_scale={self.raw_scale}, scale={self.scale}"
        )


def _transform(layer: LayerSpec) -> tuple[float, np.ndarray | None]:
    """``scale`` and ``mean_value`` of a data layer's ``transform_param``; refuse what sparkdp cannot apply."""
    param = layer.sub("transform_param")
    unsupported = [
        f for f in ("mean_file", "crop_size", "mirror") if param.get(f) not in (None, 0, False, "")
    ]
    if unsupported:
        raise ConfigError(
            f"{layer.describe()}: transform_param {', '.join(unsupported)} is not applied by sparkdp's data "
            "feeding yet; preprocess the data accordingly and remove it (mean_file: use mean_value)."
        )
    scale = float(param.get("scale", 1.0))
    means = [float(v) for v in param.getall("mean_value")]
    if not means:
        return scale, None
    mean = np.asarray(means, dtype=np.float32)
    return scale, (mean.reshape(-1, 1, 1) if len(means) > 1 else mean.reshape(()))


# ------------------------------------------------------------------ solver -> optimizer


class CaffeSolverHooks:
    """The parts of Caffe's ``Solver::Step`` around the update, as optimizer step hooks.

    Before each step: ``clip_gradients`` (global L2 norm; with ``iter_size: k`` the
    gradients are the mean of k batches, so the threshold is ``clip / k``, as Caffe clips
    the un-normalized sum).  After it: ``iter += 1`` and every group's ``lr`` set to the
    ``lr_policy`` rate of the next iteration (the Caffe optimizers multiply by ``lr_mult``).
    ``caffe_iter`` and multistep's ``caffe_step`` are kept in each param group, so they
    travel with ``optimizer.state_dict()``.
    """

    def __init__(self, spec: SolverSpec) -> None:
        self.spec = spec

    def attach(self, optimizer: Optimizer) -> Optimizer:
        for group in optimizer.param_groups:
            group.setdefault("caffe_iter", 0)
            group.setdefault("caffe_step", 0)
        self._set_rate(optimizer)
        optimizer.register_step_pre_hook(self.before_step)
        optimizer.register_step_post_hook(self.after_step)
        return optimizer

    def _set_rate(self, optimizer: Optimizer) -> None:
        first = optimizer.param_groups[0]
        it = int(first["caffe_iter"])
        step = advance_current_step(self.spec.stepvalue, it, int(first["caffe_step"]))
        rate = learning_rate(self.spec, it, step)
        for group in optimizer.param_groups:
            group["lr"], group["caffe_step"], group["caffe_iter"] = rate, step, it

    @torch.no_grad()
    def before_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        clip = self.spec.clip_gradients
        if clip < 0:
            return
        grads = [
            p.grad
            for g in optimizer.param_groups
            for p in g["params"]
            if p.requires_grad and p.grad is not None
        ]
        if not grads:
            return
        norm = math.sqrt(float(sum(g.float().pow(2).sum() for g in grads)))
        threshold = clip / self.spec.iter_size
        if norm > threshold:
            for g in grads:
                g.mul_(threshold / norm)

    def after_step(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            group["caffe_iter"] = int(group["caffe_iter"]) + 1
        self._set_rate(optimizer)


class CaffeOptimizerFactory:
    """``params -> Optimizer``: the solver's optimizer over the net's ``lr_mult`` groups.

    Made on the driver from the model; called in each worker with
    ``list(model.parameters())`` of the worker's copy, whose parameters it groups by
    index (the order ``parameters()`` gives is the same in every copy).  Picklable.
    """

    def __init__(self, spec: SolverSpec, model: nn.Module) -> None:
        self.spec = spec
        params = list(model.parameters())
        index = {id(p): i for i, p in enumerate(params)}
        self.num_params = len(params)
        if hasattr(model, "param_groups") and hasattr(model, "caffe_layers"):
            groups = model.param_groups(spec.base_lr, spec.weight_decay)
            self.groups = [
                ([index[id(p)] for p in g["params"]], float(g["lr_mult"]), float(g["decay_mult"]))
                for g in groups
            ]
        else:  # any other module: one group, multipliers 1
            self.groups = [([i for i, p in enumerate(params) if p.requires_grad], 1.0, 1.0)]

    def __call__(self, params: Iterable[torch.Tensor]) -> Optimizer:
        params = list(params.parameters()) if isinstance(params, nn.Module) else list(params)
        if len(params) != self.num_params:
            raise ConfigError(
                f"the Caffe solver's optimizer was made for a model with {self.num_params} parameter tensors, "
                f"but got {len(params)}; build the factory from the model being trained."
            )
        groups = [
            {"params": [params[i] for i in idx], "lr_mult": lr_mult, "decay_mult": decay_mult}
            for idx, lr_mult, decay_mult in self.groups
            if idx
        ]
        return CaffeSolverHooks(self.spec).attach(make_optimizer(self.spec, groups))

    def __repr__(self) -> str:
        mults = sorted({(lr, dm) for _, lr, dm in self.groups})
        return (
            f"CaffeOptimizerFactory({self.spec.type}, base_lr={self.spec.base_lr}, "
            f"lr_policy={self.spec.lr_policy!r}, (lr_mult, decay_mult)={mults})"
        )


# ------------------------------------------------------------------------ fit_caffe


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


def _sample_shape(data: Any) -> tuple[int, ...] | None:
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
        data, eval_data: as for :func:`sparkdp.fit`; a built-in dataset name feeds its
            training split and evaluates on its test split.
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
        sample_shape=sample_shape or _sample_shape(data),
        raw_scale=1.0 if raw_scale is None else raw_scale,
        weights=weights,
        seed=seed,
    )
    batch = effective_batch_size(model, spec, batch_size)
    if epochs is None:
        if workers is None:
            from ..spark.launcher import task_slots
            from ..spark.session import session

            spark = spark or session(master)
            workers = task_slots(spark.sparkContext) or 2
        rows = data.num_samples() if hasattr(data, "num_samples") else _rows(data)
        epochs = plan_epochs(spec, batch, workers, rows)
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
) -> CaffeClassifier:
    """The :class:`CaffeClassifier` to train (fillers seeded by ``seed``), with initial weights if given."""
    from .weights import load_weights

    _note_ignored(spec)
    torch.manual_seed(seed)
    model = CaffeClassifier(net, sample_shape=sample_shape, raw_scale=raw_scale)
    if weights is not None:
        summary = load_weights(model, weights)
        log.info(
            "loaded %s: layers %s%s",
            weights,
            ", ".join(summary.loaded),
            f" (ignored file layers: {', '.join(summary.ignored)})" if summary.ignored else "",
        )
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


class CaffeCLIJob:
    """What ``sparkdp train --caffe-net/--caffe-solver`` adds to a run (see :func:`cli_job`)."""

    def __init__(
        self, model: CaffeClassifier, spec: SolverSpec, batch_size: int, epochs: int, desc: dict[str, Any]
    ) -> None:
        self.model, self.spec, self.batch_size, self.epochs, self.desc = model, spec, batch_size, epochs, desc
        self.loss = model.caffe_loss()
        self.optimizer = CaffeOptimizerFactory(spec, model)

    def save(self, out_dir: str | os.PathLike[str], model: nn.Module | None = None) -> Path:
        """Write ``OUT/model.caffemodel`` (atomically)."""
        from .weights import save_weights

        directory = Path(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        return save_weights(
            model if model is not None else self.model,
            directory / "model.caffemodel",
            name=self.model.net.name,
        )


def cli_job(args: Any, data: Any, model_desc: dict[str, Any]) -> CaffeCLIJob:
    """Build the Caffe model, loss, optimizer, batch size and epochs for ``sparkdp train``.

    ``args`` has ``caffe_net``, ``caffe_solver``, ``caffe_weights``, ``script``, ``model``,
    ``optimizer``, ``lr``, ``momentum``, ``dataset``, ``batch_size``, ``epochs``, ``workers``,
    ``master`` and ``seed``; ``data`` is the training WorkerData.
    """
    if not args.caffe_solver:
        raise ConfigError(
            "--caffe-net/--caffe-weights need --caffe-solver SOLVER.prototxt: the solver sets "
            "the optimizer, learning-rate policy and iterations."
        )
    clashes = [
        flag
        for flag, value in (
            ("a training script", args.script),
            ("--model", args.model),
            ("--optimizer", args.optimizer),
            ("--lr", args.lr),
            ("--momentum", args.momentum),
        )
        if value
    ]
    if clashes:
        raise ConfigError(
            f"--caffe-net/--caffe-solver define the model and optimizer, so {', '.join(clashes)} "
            "cannot be used with them; change the prototxt files instead."
        )
    spec = read_solver_spec(Path(args.caffe_solver))
    net = Path(args.caffe_net) if args.caffe_net else solver_net_source(spec, args.caffe_solver)
    if isinstance(net, Path) and not net.is_file():
        raise ConfigError(f"Caffe net prototxt {str(net)!r} does not exist.")
    # sparkdp's built-in datasets hold images scaled to [0, 1]; Caffe's data layers see raw pixels.
    raw_scale = 255.0 if args.dataset else 1.0
    model = build_model(
        net,
        spec,
        sample_shape=_sample_shape(data),
        raw_scale=raw_scale,
        weights=args.caffe_weights,
        seed=args.seed,
    )
    batch = effective_batch_size(model, spec, args.batch_size)
    epochs = args.epochs
    if epochs is None:
        workers = args.workers
        if workers is None:
            from ..spark.launcher import task_slots
            from ..spark.session import session

            workers = task_slots(session(args.master).sparkContext) or 2
        num_samples = getattr(data, "num_samples", None)
        epochs = plan_epochs(spec, batch, workers, num_samples() if callable(num_samples) else None)
    model_desc.update(
        {
            "caffe_net": str(Path(net).resolve()) if isinstance(net, Path) else "(inline in solver)",
            "caffe_solver": str(Path(args.caffe_solver).resolve()),
        }
    )
    if args.caffe_weights:
        model_desc["caffe_weights"] = str(Path(args.caffe_weights).resolve())
    return CaffeCLIJob(model, spec, batch, epochs, model_desc)
