"""Typed views of a Caffe ``NetParameter``: upgrades, validation and phase filtering.

:func:`load_net_spec` parses a ``.prototxt`` (V1 ``layers {}`` or V2 ``layer {}``),
checks every field name against the tables below (an unknown field gets the nearest
valid one as a hint), applies Caffe's upgrades (``upgrade_proto.cpp``: V1 data
transformation, V1 → V2, deprecated ``input:`` header, BatchNorm params) and returns a
:class:`NetSpec` of plain dataclasses.  :func:`filter_layers` applies Caffe's
``include``/``exclude`` rules for a phase, level and stages.  No torch here.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from ..errors import ConfigError
from .textformat import Identifier, Message, parse, parse_file

__all__ = [
    "LayerSpec", "NetSpec", "NetState", "ParamSpec", "StateRule", "V1_LAYER_TYPES", "V1_LAYER_TYPE_NUMBERS",
    "filter_layers", "load_net_spec", "validate_fields",
]  # fmt: skip

# Field names per message type; ``name:Type`` marks a sub-message that is checked too.
_F = "weight_filler:FillerParameter bias_filler:FillerParameter"
_SCHEMA_TEXT = {
    "NetParameter": "name input input_shape:BlobShape input_dim force_backward state:NetState debug_info "
    "layer:LayerParameter layers:V1LayerParameter",
    "NetState": "phase level stage",
    "NetStateRule": "phase min_level max_level stage not_stage",
    "ParamSpec": "name share_mode lr_mult decay_mult",
    "BlobShape": "dim",
    "BlobProto": "shape:BlobShape data diff double_data double_diff num channels height width",
    "FillerParameter": "type value min max mean std sparse variance_norm",
    "TransformationParameter": "scale mirror crop_size mean_file mean_value force_color force_gray",
    "LossParameter": "ignore_label normalization normalize",
    "AccuracyParameter": "top_k axis ignore_label",
    "ArgMaxParameter": "out_max_val top_k axis",
    "BatchNormParameter": "use_global_stats moving_average_fraction eps",
    "BiasParameter": "axis num_axes filler:FillerParameter",
    "ClipParameter": "min max",
    "ConcatParameter": "axis concat_dim",
    "ContrastiveLossParameter": "margin legacy_version",
    "ConvolutionParameter": f"num_output bias_term pad kernel_size stride dilation pad_h pad_w kernel_h kernel_w "
    f"stride_h stride_w group {_F} engine axis force_nd_im2col",
    "CropParameter": "axis offset",
    "DataParameter": "source batch_size rand_skip backend scale mean_file crop_size mirror "
    "force_encoded_color prefetch",
    "DropoutParameter": "dropout_ratio",
    "DummyDataParameter": "data_filler:FillerParameter shape:BlobShape num channels height width",
    "EltwiseParameter": "operation coeff stable_prod_grad",
    "ELUParameter": "alpha",
    "EmbedParameter": f"num_output input_dim bias_term {_F}",
    "ExpParameter": "base scale shift",
    "FlattenParameter": "axis end_axis",
    "HDF5DataParameter": "source batch_size shuffle",
    "HDF5OutputParameter": "file_name",
    "HingeLossParameter": "norm",
    "ImageDataParameter": "source batch_size rand_skip shuffle new_height new_width is_color scale "
    "mean_file crop_size mirror root_folder",
    "InfogainLossParameter": "source axis",
    "InnerProductParameter": f"num_output bias_term {_F} axis transpose",
    "InputParameter": "shape:BlobShape",
    "LogParameter": "base scale shift",
    "LRNParameter": "local_size alpha beta norm_region k engine",
    "MemoryDataParameter": "batch_size channels height width",
    "MVNParameter": "normalize_variance across_channels eps",
    "ParameterParameter": "shape:BlobShape",
    "PoolingParameter": "pool pad pad_h pad_w kernel_size kernel_h kernel_w stride stride_h stride_w "
    "engine global_pooling round_mode",
    "PowerParameter": "power scale shift",
    "PReLUParameter": "filler:FillerParameter channel_shared",
    "PythonParameter": "module layer param_str share_in_parallel",
    "RecurrentParameter": f"num_output {_F} debug_info expose_hidden",
    "ReductionParameter": "operation axis coeff",
    "ReLUParameter": "negative_slope engine",
    "ReshapeParameter": "shape:BlobShape axis num_axes",
    "ScaleParameter": "axis num_axes filler:FillerParameter bias_term bias_filler:FillerParameter",
    "SigmoidParameter": "engine",
    "SliceParameter": "axis slice_point slice_dim",
    "SoftmaxParameter": "engine axis",
    "SPPParameter": "pyramid_height pool engine",
    "SwishParameter": "beta",
    "TanHParameter": "engine",
    "ThresholdParameter": "threshold",
    "TileParameter": "axis tiles",
    "WindowDataParameter": "source scale mean_file batch_size crop_size mirror fg_threshold bg_threshold "
    "fg_fraction context_pad crop_mode cache_images root_folder",
}
# ``*_param`` field -> message type: ``batch_norm_param`` -> ``BatchNormParameter`` unless listed here.
_PARAM_TYPE_EXCEPTIONS = {
    "transform_param": "TransformationParameter", "argmax_param": "ArgMaxParameter", "elu_param": "ELUParameter",
    "hdf5_data_param": "HDF5DataParameter", "hdf5_output_param": "HDF5OutputParameter", "lrn_param": "LRNParameter",
    "mvn_param": "MVNParameter", "prelu_param": "PReLUParameter", "relu_param": "ReLUParameter",
    "spp_param": "SPPParameter", "tanh_param": "TanHParameter",
}  # fmt: skip
_PARAM_FIELDS = (
    "transform_param loss_param accuracy_param argmax_param batch_norm_param bias_param clip_param concat_param "
    "contrastive_loss_param convolution_param crop_param data_param dropout_param dummy_data_param eltwise_param "
    "elu_param embed_param exp_param flatten_param hdf5_data_param hdf5_output_param hinge_loss_param "
    "image_data_param infogain_loss_param inner_product_param input_param log_param lrn_param memory_data_param "
    "mvn_param parameter_param pooling_param power_param prelu_param python_param recurrent_param "
    "reduction_param relu_param reshape_param scale_param sigmoid_param softmax_param spp_param slice_param "
    "swish_param tanh_param threshold_param tile_param window_data_param"
).split()
_PARAM_TYPES = {
    name: _PARAM_TYPE_EXCEPTIONS.get(name)
    or "".join(part.capitalize() for part in name.removesuffix("_param").split("_")) + "Parameter"
    for name in _PARAM_FIELDS
}
_COMMON_LAYER = "name bottom top loss_weight include:NetStateRule exclude:NetStateRule blobs:BlobProto"
_SCHEMA_TEXT["LayerParameter"] = f"{_COMMON_LAYER} type phase param:ParamSpec propagate_down"
_SCHEMA_TEXT["V1LayerParameter"] = f"{_COMMON_LAYER} type param blob_share_mode blobs_lr weight_decay layer"
_SCHEMA: dict[str, dict[str, str | None]] = {
    msg: {f.split(":")[0]: (f.split(":")[1] if ":" in f else None) for f in text.split()}
    for msg, text in _SCHEMA_TEXT.items()
}
for _layer_type in ("LayerParameter", "V1LayerParameter"):
    _SCHEMA[_layer_type].update(_PARAM_TYPES)

# V1LayerParameter.LayerType (caffe.proto), listed by enum number 0..39.
V1_LAYER_TYPE_NUMBERS = dict(enumerate((
    "NONE ACCURACY BNLL CONCAT CONVOLUTION DATA DROPOUT EUCLIDEAN_LOSS FLATTEN HDF5_DATA HDF5_OUTPUT IM2COL "
    "IMAGE_DATA INFOGAIN_LOSS INNER_PRODUCT LRN MULTINOMIAL_LOGISTIC_LOSS POOLING RELU SIGMOID SOFTMAX "
    "SOFTMAX_LOSS SPLIT TANH WINDOW_DATA ELTWISE POWER SIGMOID_CROSS_ENTROPY_LOSS HINGE_LOSS MEMORY_DATA ARGMAX "
    "THRESHOLD DUMMY_DATA SLICE MVN ABSVAL SILENCE CONTRASTIVE_LOSS EXP DECONVOLUTION"
).split()))  # fmt: skip
# ``UpgradeV1LayerType``: V1 enum name -> V2 type string (INNER_PRODUCT -> InnerProduct unless listed).
_V1_EXCEPTIONS = {
    "ABSVAL": "AbsVal", "ARGMAX": "ArgMax", "BNLL": "BNLL", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "LRN": "LRN", "MVN": "MVN", "RELU": "ReLU", "SOFTMAX_LOSS": "SoftmaxWithLoss", "TANH": "TanH",
}  # fmt: skip
V1_LAYER_TYPES = {
    name: _V1_EXCEPTIONS.get(name) or "".join(part.capitalize() for part in name.split("_"))
    for name in V1_LAYER_TYPE_NUMBERS.values()
    if name != "NONE"
}


@dataclass
class ParamSpec:
    """``param {}``: one per parameter blob.  ``None`` multipliers mean "unset" (Caffe default 1)."""

    name: str = ""
    lr_mult: float | None = None
    decay_mult: float | None = None
    share_mode: str | None = None  # STRICT (default) | PERMISSIVE


@dataclass
class StateRule:
    """A ``NetStateRule`` from ``include {}``/``exclude {}``."""

    phase: str | None = None
    min_level: int | None = None
    max_level: int | None = None
    stage: list[str] = field(default_factory=list)
    not_stage: list[str] = field(default_factory=list)

    def met_by(self, state: NetState) -> bool:
        """``Net::StateMeetsRule``."""
        return (
            (self.phase is None or self.phase == state.phase)
            and (self.min_level is None or state.level >= self.min_level)
            and (self.max_level is None or state.level <= self.max_level)
            and all(s in state.stages for s in self.stage)
            and not any(s in state.stages for s in self.not_stage)
        )


@dataclass
class NetState:
    phase: str = "TEST"  # Caffe's default phase
    level: int = 0
    stages: tuple[str, ...] = ()


@dataclass
class LayerSpec:
    """One layer after the V1 → V2 upgrade.

    ``param`` holds the layer's ``*_param`` sub-messages (``layer.sub("pooling_param")``);
    ``params`` the ``param {}`` specs, one per parameter blob.
    """

    name: str
    type: str
    bottoms: list[str] = field(default_factory=list)
    tops: list[str] = field(default_factory=list)
    params: list[ParamSpec] = field(default_factory=list)
    loss_weights: list[float] = field(default_factory=list)
    include: list[StateRule] = field(default_factory=list)
    exclude: list[StateRule] = field(default_factory=list)
    phase: str | None = None
    param: Message = field(default_factory=Message)
    blobs: list[Message] = field(default_factory=list)
    where: str = field(default="", compare=False)

    def sub(self, name: str) -> Message:
        """The sub-message ``name`` (e.g. ``"convolution_param"``), empty if absent."""
        value = self.param.get(name)
        return value if isinstance(value, Message) else Message()

    def describe(self) -> str:
        return f"layer {self.name!r} (type {self.type})"

    def top_loss_weights(self) -> list[float]:
        """Caffe's per-top loss weights (``*Loss`` layers default to 1 on their first top)."""
        if self.loss_weights:
            return [float(w) for w in self.loss_weights]
        return [1.0] + [0.0] * (len(self.tops) - 1) if self.type.endswith("Loss") else []


@dataclass
class NetSpec:
    name: str = ""
    layers: list[LayerSpec] = field(default_factory=list)
    state: NetState = field(default_factory=NetState)


# ---------------------------------------------------------------------- validation


def validate_fields(msg: Message, msg_type: str, context: str = "") -> None:
    """Reject unknown fields of ``msg`` (of protobuf type ``msg_type``), recursively.

    Raises:
        ConfigError: naming the field, where it is, and the nearest valid field.
    """
    table = _SCHEMA.get(msg_type)
    if table is None:
        return
    for index, (name, value) in enumerate(msg.fields):
        if name not in table:
            close = difflib.get_close_matches(name, table, n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else f" Valid fields: {', '.join(sorted(table))}."
            raise ConfigError(f"{msg.where(index)}: unknown field {name!r} in {msg_type}{context}.{hint}")
        sub_type = table[name]
        if isinstance(value, Message):
            if sub_type is None and name != "layer":
                raise ConfigError(
                    f"{value.where()}: field {name!r} of {msg_type} takes a value, not a message"
                )
            validate_fields(value, sub_type or "", context)
        elif sub_type is not None:
            raise ConfigError(f"{msg.where(index)}: field {name!r} of {msg_type} must be a message {{ ... }}")


# ------------------------------------------------------------------------ loading


def _enum(value: Any) -> str:
    return str(value) if isinstance(value, (str, Identifier)) else repr(value)


def _rule(msg: Message) -> StateRule:
    return StateRule(
        phase=_enum(msg.get("phase")) if msg.has("phase") else None,
        min_level=msg.get("min_level"),
        max_level=msg.get("max_level"),
        stage=[str(s) for s in msg.getall("stage")],
        not_stage=[str(s) for s in msg.getall("not_stage")],
    )


def _param_fields(msg: Message) -> Message:
    return Message(
        [(k, v) for k, v in msg.fields if k.endswith("_param")], msg.line, msg.column, msg.filename
    )


def _v2_layer(msg: Message) -> LayerSpec:
    params = [
        ParamSpec(
            str(p.get("name", "")),
            p.get("lr_mult"),
            p.get("decay_mult"),
            _enum(p.get("share_mode")) if p.has("share_mode") else None,
        )
        for p in msg.getall("param")
    ]
    return _common(msg, str(msg.get("type", "")), params)


def _common(msg: Message, type_: str, params: list[ParamSpec]) -> LayerSpec:
    layer = LayerSpec(
        name=str(msg.get("name", "")),
        type=type_,
        bottoms=[str(b) for b in msg.getall("bottom")],
        tops=[str(t) for t in msg.getall("top")],
        params=params,
        loss_weights=[float(w) for w in msg.getall("loss_weight")],
        include=[_rule(r) for r in msg.getall("include")],
        exclude=[_rule(r) for r in msg.getall("exclude")],
        phase=_enum(msg.get("phase")) if msg.has("phase") else None,
        param=_param_fields(msg),
        blobs=msg.getall("blobs"),
        where=msg.where(),
    )
    if layer.include and layer.exclude:
        raise ConfigError(
            f"{layer.where}: {layer.describe()} has both include and exclude rules; Caffe allows one kind"
        )
    if layer.loss_weights and len(layer.loss_weights) != len(layer.tops):
        raise ConfigError(
            f"{layer.where}: {layer.describe()} gives {len(layer.loss_weights)} loss_weight values for "
            f"{len(layer.tops)} tops; give none or exactly one per top"
        )
    if layer.type == "BatchNorm" and len(layer.params) == 3:
        # UpgradeNetBatchNorm: the three statistics blobs are never learned.
        layer.params = [replace(p, lr_mult=0.0, decay_mult=0.0) for p in layer.params]
    return layer


def _v1_layer(msg: Message) -> LayerSpec:
    if msg.has("layer"):
        raise ConfigError(
            f"{msg.where()}: V0 layer definitions (layers {{ layer {{ ... }} }}) are not supported; "
            "upgrade the file with Caffe's upgrade_net_proto_text tool"
        )
    raw = msg.get("type")
    enum_name = V1_LAYER_TYPE_NUMBERS.get(raw, "") if isinstance(raw, int) else str(raw or "")
    if enum_name not in V1_LAYER_TYPES:
        raise ConfigError(
            f"{msg.where()}: unknown V1 layer type '{raw}'; known: {', '.join(sorted(V1_LAYER_TYPES))}"
        )
    names, modes = msg.getall("param"), msg.getall("blob_share_mode")
    lrs, decays = msg.getall("blobs_lr"), msg.getall("weight_decay")
    params = [
        ParamSpec(
            name=str(names[i]) if i < len(names) else "",
            lr_mult=float(lrs[i]) if i < len(lrs) else None,
            decay_mult=float(decays[i]) if i < len(decays) else None,
            share_mode=_enum(modes[i]) if i < len(modes) else None,
        )
        for i in range(max(len(names), len(modes), len(lrs), len(decays)))
    ]
    return _common(_upgrade_v1_transform(msg), V1_LAYER_TYPES[enum_name], params)


def _upgrade_v1_transform(msg: Message) -> Message:
    """``UpgradeNetDataTransformation``: move V1 data fields into ``transform_param``."""
    moved: list[tuple[str, Any]] = []
    fields: list[tuple[str, Any]] = []
    for key, value in msg.fields:
        if key in ("data_param", "image_data_param", "window_data_param") and isinstance(value, Message):
            keep = [(k, v) for k, v in value.fields if k not in ("scale", "mean_file", "crop_size", "mirror")]
            moved += [(k, v) for k, v in value.fields if k in ("scale", "mean_file", "crop_size", "mirror")]
            value = Message(keep, value.line, value.column, value.filename)
        fields.append((key, value))
    if moved:
        old = msg.get("transform_param") or Message(line=msg.line, column=msg.column, filename=msg.filename)
        fields = [(k, v) for k, v in fields if k != "transform_param"]
        fields.append(("transform_param", Message(old.fields + moved, old.line, old.column, old.filename)))
    return Message(fields, msg.line, msg.column, msg.filename)


def _input_layer(net: Message) -> LayerSpec | None:
    """``UpgradeNetInput``: the deprecated ``input:`` header becomes an ``Input`` layer."""
    inputs = [str(i) for i in net.getall("input")]
    shapes, dims = net.getall("input_shape"), net.getall("input_dim")
    if not inputs:
        if shapes or dims:
            raise ConfigError(f"{net.where()}: input_shape/input_dim given without any 'input:' names")
        return None
    if shapes and dims:
        raise ConfigError(f"{net.where()}: give either input_shape or the deprecated input_dim, not both")
    if not shapes and not dims:
        return None  # legacy caffemodel header without shapes: Caffe strips it
    if dims:
        if len(dims) != 4 * len(inputs):
            raise ConfigError(
                f"{net.where()}: input_dim needs 4 values (N, C, H, W) per input; "
                f"got {len(dims)} for {len(inputs)} input(s)"
            )
        shapes = [Message([("dim", d) for d in dims[4 * i : 4 * i + 4]]) for i in range(len(inputs))]
    elif len(shapes) != len(inputs):
        raise ConfigError(f"{net.where()}: {len(inputs)} input(s) but {len(shapes)} input_shape message(s)")
    param = Message([("input_param", Message([("shape", s) for s in shapes]))])
    return LayerSpec(name="input", type="Input", tops=inputs, param=param, where=net.where())


def is_prototxt_path(source: object) -> TypeGuard[str | os.PathLike[str]]:
    """Whether ``source`` names a file rather than holding prototxt text (a ``str`` without ``{`` or a newline)."""
    return isinstance(source, os.PathLike) or (
        isinstance(source, str) and "{" not in source and "\n" not in source
    )


def load_net_spec(source: str | os.PathLike[str] | Message | NetSpec) -> NetSpec:
    """Parse, validate and upgrade a Caffe net definition.

    Args:
        source: a path to a ``.prototxt``, the text itself, or a parsed :class:`Message`.
            A ``str`` without ``{`` or a newline is taken as a path.  A :class:`NetSpec`
            is returned as it is.

    Returns:
        The upgraded net with every layer of the file (not yet filtered by phase).

    Raises:
        ConfigError: unknown fields, V1 and V2 layers in one file, bad ``input_dim``…
    """
    if isinstance(source, NetSpec):
        return source
    if isinstance(source, Message):
        net = source
    elif isinstance(source, os.PathLike) or ("{" not in source and "\n" not in source):
        net = parse_file(source)
    else:
        net = parse(source)
    validate_fields(net, "NetParameter")
    if net.has("layer") and net.has("layers"):
        raise ConfigError(
            f"{net.where()}: the file mixes V1 'layers {{}}' and V2 'layer {{}}' definitions; "
            "Caffe refuses this — use one spelling"
        )
    layers = [_v2_layer(m) for m in net.getall("layer")] + [_v1_layer(m) for m in net.getall("layers")]
    head = _input_layer(net)
    state_msg = net.get("state") or Message()
    state = NetState(
        phase=_enum(state_msg.get("phase", "TEST")),
        level=int(state_msg.get("level", 0)),
        stages=tuple(str(s) for s in state_msg.getall("stage")),
    )
    return NetSpec(name=str(net.get("name", "")), layers=([head] if head else []) + layers, state=state)


def filter_layers(spec: NetSpec, state: NetState) -> NetSpec:
    """``Net::FilterNet``: keep the layers whose include/exclude rules admit ``state``."""
    if state.phase not in ("TRAIN", "TEST"):
        raise ConfigError(f"phase must be 'TRAIN' or 'TEST'; got {state.phase!r}")
    kept = []
    for layer in spec.layers:
        if layer.include:
            ok = any(rule.met_by(state) for rule in layer.include)
        else:
            ok = not any(rule.met_by(state) for rule in layer.exclude)
        if ok:
            kept.append(layer)
    return NetSpec(name=spec.name, layers=kept, state=state)
