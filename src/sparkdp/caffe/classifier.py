"""A Caffe train net as what sparkdp's loop calls: ``model(x)`` -> prediction, ``loss(prediction, y)``.

:class:`CaffeClassifier` builds the layers the prediction depends on (the first bottom of
the net's loss layer, e.g. LeNet's ``ip2``), applies the Data layer's ``transform_param``
(``(x * raw_scale - mean_value) * scale``) to what sparkdp feeds, and keeps Caffe's view of
itself (``caffe_layers``, ``blobs_of``, ``param_groups``) for weights and solvers.
:class:`CaffeLoss` is the net's loss layer times its ``loss_weight``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from .layers import CONVERTERS, BuildContext
from .layers.data import SOURCE_TYPES
from .net import CaffeNet
from .spec import LayerSpec, NetSpec, NetState, filter_layers, load_net_spec
from .textformat import Message

log = logging.getLogger(__name__)

# Where each image-record source keeps its batch_size.
_BATCH_PARAM = {"Data": "data_param", "ImageData": "image_data_param", "MemoryData": "memory_data_param",
                "HDF5Data": "hdf5_data_param"}  # fmt: skip


def _prototxt_batch(layer: LayerSpec) -> int | None:
    """The batch size a data layer states, if any."""
    if layer.type in _BATCH_PARAM:
        value = layer.sub(_BATCH_PARAM[layer.type]).get("batch_size")
        return int(value) if isinstance(value, int) and value > 0 else None
    return None


def _ancestors(layers: Sequence[LayerSpec], blobs: Sequence[str]) -> tuple[list[LayerSpec], set[str]]:
    """The layers (in file order) the blobs' final values depend on (in-place ones included), and their blobs."""
    needed, kept = set(blobs), []
    for layer in reversed(layers):
        if needed & set(layer.tops):
            kept.append(layer)
            needed |= set(layer.bottoms)
    return kept[::-1], needed


class CaffeLoss(nn.Module):
    """``loss(prediction, labels)``: the net's loss layer applied as Caffe does.

    The value is ``Σ loss_weight × sum(top)`` over the layer's tops, computed by the
    layer converter's own module (e.g. SoftmaxWithLoss with its ``normalization`` and
    ``ignore_label``).  ``prediction`` is a tuple when the loss reads several predicted
    blobs (a Siamese net's two features); ``labels`` goes to the bottom at ``label_index``.
    Picklable; no parameters.
    """

    def __init__(
        self, layer: nn.Module, weights: Sequence[float], name: str = "", label_index: int = 1
    ) -> None:
        super().__init__()
        self.layer = layer
        self.weights = [float(w) for w in weights]
        self.name = name
        self.label_index = label_index

    def forward(
        self, prediction: torch.Tensor | tuple[torch.Tensor, ...], labels: torch.Tensor
    ) -> torch.Tensor:
        bottoms = list(prediction) if isinstance(prediction, tuple) else [prediction]
        bottoms.insert(self.label_index, labels)
        tops = self.layer(*bottoms)
        total = bottoms[0].new_zeros(())
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
        apply_transform: False when the fed values come transformed already (the data
            layer's own source read by ``caffe/sources/``, which also applies crop_size,
            mirror and mean_file): transform_param is then not applied here (leave raw_scale at 1).
        input_shapes: shapes of other fed tops, e.g. an HDF5Data layer's label
            ``{"label": (N,)}`` (HDF5Data layers state no shapes).

    The net must have exactly one loss layer, whose bottoms are the prediction (or several,
    such as a Siamese net's two features) and a label fed by a data layer, and one other fed
    input (the data).  The other fed tops (the label) are fed zeros, since only layers the
    prediction depends on are built.  ``model(x)`` returns the prediction, or a tuple of
    them in the loss layer's bottom order.

    Attributes:
        net: the :class:`CaffeNet` of those layers.
        data_blob, label_blob: the fed data and the loss's label.
        prediction_blobs: the loss's other bottoms, the outputs; ``prediction_blob`` is the first.
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
        apply_transform: bool = True,
        input_shapes: dict[str, Sequence[int]] | None = None,
    ) -> None:
        super().__init__()
        spec = load_net_spec(net)
        state = NetState(str(phase).upper(), int(level), tuple(stages))
        layers = filter_layers(spec, state).layers
        losses = [(i, layer) for i, layer in enumerate(layers) if any(layer.top_loss_weights())]
        if len(losses) != 1:
            found = ", ".join(f"{layer.name!r} ({layer.type})" for _, layer in losses) or "none"
            raise ConfigError(
                f"sparkdp trains a Caffe net with exactly one loss layer in the {state.phase} phase; "
                f"net {spec.name!r} has {len(losses)}: {found}. Keep one loss (set loss_weight: 0 on "
                "the others, or remove them)."
            )
        index, loss = losses[0]
        source_tops = {top for layer in layers[:index] if layer.type in SOURCE_TYPES for top in layer.tops}
        labels = [b for b in loss.bottoms if b in source_tops]
        predictions = [b for b in loss.bottoms if b not in source_tops]
        if len(labels) != 1 or not predictions:
            raise ConfigError(
                f"{loss.describe()} reads bottoms {loss.bottoms}, of which {len(labels)} come straight from a "
                "data layer; sparkdp needs the prediction(s) and exactly one label that a Data/Input layer "
                "produces (sparkdp feeds the labels to the loss)."
            )
        label = labels[0]
        head, needed = _ancestors(layers[:index], predictions)
        sources = [layer for layer in head if layer.type in SOURCE_TYPES]
        fed = [top for layer in sources for top in layer.tops if top in needed]
        if len(fed) != 1:
            raise ConfigError(
                f"the prediction(s) {predictions} of {loss.describe()} depend on {len(fed)} fed blob(s) "
                f"{fed}; sparkdp feeds exactly one (the features)."
            )
        self.data_blob, self.label_blob = fed[0], label
        self.prediction_blobs, self.prediction_blob = tuple(predictions), predictions[0]
        self._label_index = loss.bottoms.index(label)
        source = next(layer for layer in sources if self.data_blob in layer.tops)
        self.batch_size = _prototxt_batch(source)
        shapes = {name: tuple(int(d) for d in s) for name, s in (input_shapes or {}).items()} or None
        if sample_shape is not None:
            shapes = {
                **(shapes or {}),
                self.data_blob: (self.batch_size or 1, *(int(d) for d in sample_shape)),
            }
            if label in {top for layer in sources for top in layer.tops}:  # (N,): Caffe's class labels
                shapes.setdefault(label, (self.batch_size or 1,))
        self.net = CaffeNet(dataclasses.replace(spec, layers=head, state=state), state, shapes)
        self._zero_inputs = [n for n in self.net.input_names if n != self.data_blob]
        self.raw_scale = float(raw_scale)
        # apply_transform=False: the data source already applied transform_param (caffe/sources/)
        self.scale, mean = _transform(source) if apply_transform else (1.0, None)
        self.mean: torch.Tensor | None
        self.register_buffer("mean", None if mean is None else torch.tensor(mean), persistent=False)
        self._loss_layer, self._loss_weights = loss, loss.top_loss_weights()
        first = self.net.blob_shapes[predictions[0]]
        label_shape = self.net.blob_shapes.get(label, (first[0],))
        self._loss_shapes = [label_shape if b == label else self.net.blob_shapes[b] for b in loss.bottoms]
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
        return CaffeLoss(built.module, self._loss_weights, loss.name, self._label_index)

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

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        x = self.transform(x)
        inputs = {self.data_blob: x}
        for name in self._zero_inputs:  # the label: its layers are not built, so its value is unused
            inputs[name] = x.new_zeros((x.shape[0], *self.net.input_shapes[name][1:]))
        out = self.net(**inputs)
        if not isinstance(out, dict):
            return out
        if len(self.prediction_blobs) == 1:
            return out[self.prediction_blob]
        return tuple(out[name] for name in self.prediction_blobs)

    def extra_repr(self) -> str:
        return (
            f"data={self.data_blob!r} -> prediction={', '.join(map(repr, self.prediction_blobs))}, "
            f"loss={self._loss_layer.name!r} "
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
            f"{layer.describe()}: transform_param {', '.join(unsupported)} is not applied to data given to sparkdp "
            "(--dataset/--data, fit_caffe's data=), only when it reads the layer's own source (no --dataset/--data; "
            "fit_caffe(net, solver) without data); else preprocess the data so and remove it (mean_file: use "
            "mean_value)."
        )
    scale = float(param.get("scale", 1.0))
    means = [float(v) for v in param.getall("mean_value")]
    if not means:
        return scale, None
    mean = np.asarray(means, dtype=np.float32)
    return scale, (mean.reshape(-1, 1, 1) if len(means) > 1 else mean.reshape(()))
