"""Build a PyTorch module from a Caffe net definition.

:func:`load_net` filters the layers for a phase (Caffe's ``FilterNet``), converts each
layer with the registered converter and wires blobs by name the way ``net.cpp`` does:
a bottom refers to the most recent producer of that name, an in-place layer
(``top[i] == bottom[i]``) only rebinds the name, and the net's outputs are the tops
no later layer consumes.  Data layers are the net's inputs.

Example:
    >>> net = load_net("lenet_train_test.prototxt", phase="TRAIN",
    ...                input_shapes={"data": (64, 1, 28, 28)})     # doctest: +SKIP
    >>> out = net(data=images, label=labels)                     # doctest: +SKIP
    >>> net.loss(out).backward()                                 # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ..errors import ConfigError
from .layers import CONVERTERS, SUPPORTED, BuildContext, CaffeLayer, Shape
from .spec import LayerSpec, NetSpec, NetState, ParamSpec, filter_layers, load_net_spec
from .textformat import Message

__all__ = ["CaffeNet", "load_net"]


@dataclass
class _Step:
    spec: LayerSpec
    key: str  # the module's key in ``CaffeNet.layers``
    top_shapes: list[Shape]
    is_source: bool


@dataclass
class _Learnable:
    """One owned parameter blob: where it lives and its (possibly unset) multipliers."""

    key: str
    attr: str
    qualname: str
    lr_mult: float | None
    decay_mult: float | None


# BVLC layer types with no meaning inside a PyTorch module, and what to do instead.
_REFUSED = {
    "HDF5Output": "it writes its bottoms to an HDF5 file as a side effect of the forward pass, which a "
    "PyTorch module does not do; remove it and save the outputs of the model from Python.",
    "WindowData": "R-CNN's window-file layer (crops around boxes listed in a window file) is not supported; "
    "crop the windows beforehand and feed them through a Data or Input layer.",
}


class CaffeNet(nn.Module):
    """A Caffe net as an ``nn.Module``; build it with :func:`load_net` or :meth:`from_spec`.

    ``forward(**inputs)`` (or positional tensors in :attr:`input_names` order) returns
    a dict blob name → tensor of the net's outputs, or the tensor itself when there
    is exactly one output.

    Phase-dependent layers (Dropout, BatchNorm without ``use_global_stats``) act as in
    Caffe's TRAIN phase only while the module is in training mode; ``eval()`` switches
    them to their TEST behaviour.
    """

    def __init__(
        self, spec: NetSpec, state: NetState, input_shapes: Mapping[str, Sequence[int]] | None = None
    ):
        super().__init__()
        self.name, self.phase = spec.name, state.phase
        self.layers = nn.ModuleDict()
        self._steps: list[_Step] = []
        self._learnables: list[_Learnable] = []
        self.blob_shapes: dict[str, Shape] = {}
        self.input_shapes: dict[str, Shape] = {}
        self.loss_weights: dict[str, float] = {}
        ctx = BuildContext(
            state.phase, {k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
        )
        unknown = set(ctx.input_shapes) - {t for layer in spec.layers for t in layer.tops}
        if unknown:
            raise ConfigError(
                f"input_shapes names {sorted(unknown)}, which no layer of the {state.phase} net produces"
            )
        available: dict[str, None] = {}  # ordered set: tops nobody has consumed yet
        owners: dict[str, _Learnable] = {}
        for layer in spec.layers:
            self._add_layer(layer, ctx, available, owners)
        self.output_names = list(available)
        for item in self._learnables:
            self._parameter(item).requires_grad_(item.lr_mult != 0)

    @classmethod
    def from_spec(
        cls,
        spec: NetSpec,
        phase: str = "TRAIN",
        stages: Sequence[str] = (),
        level: int = 0,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> CaffeNet:
        """Filter ``spec`` for ``phase``/``stages``/``level`` and build the module."""
        state = NetState(str(phase).upper(), int(level), tuple(stages))
        return cls(filter_layers(spec, state), state, input_shapes)

    # ----------------------------------------------------------------- building

    def _add_layer(
        self, layer: LayerSpec, ctx: BuildContext, available: dict[str, None], owners: dict[str, _Learnable]
    ) -> None:
        where = f"{layer.where}: " if layer.where else ""
        if layer.type == "Python":
            p = layer.sub("python_param")
            raise ConfigError(
                f"{where}layer {layer.name!r} is a Python layer (module {p.get('module', '?')!r}, layer "
                f"{p.get('layer', '?')!r}): it runs your own Python code, which sparkdp does not import from a "
                "prototxt. Replace it with a supported layer type, or write the model in PyTorch."
            )
        if layer.type in _REFUSED:
            raise ConfigError(f"{where}layer {layer.name!r} has type {layer.type!r}: {_REFUSED[layer.type]}")
        if layer.type not in SUPPORTED:
            case = [t for t in SUPPORTED if t.lower() == layer.type.lower()]
            close = case or difflib.get_close_matches(layer.type, SUPPORTED, n=3, cutoff=0.7)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            hint += " (type names are case-sensitive)" if case else ""
            raise ConfigError(
                f"{where}layer {layer.name!r} has type {layer.type!r}, which sparkdp cannot convert."
                f"{hint} Supported types: {', '.join(sorted(SUPPORTED))}"
            )
        for bottom in layer.bottoms:
            if bottom not in self.blob_shapes:
                close = difflib.get_close_matches(bottom, self.blob_shapes, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"{where}{layer.describe()} reads bottom blob {bottom!r}, which no earlier layer of the "
                    f"{self.phase} net produces.{hint} Blobs so far: {', '.join(self.blob_shapes) or 'none'}"
                )
        for i, top in enumerate(layer.tops):
            in_place = i < len(layer.bottoms) and layer.bottoms[i] == top
            if (top in self.blob_shapes and not in_place) or top in layer.tops[:i]:
                raise ConfigError(
                    f"{where}{layer.describe()}: top blob {top!r} is produced by multiple sources; "
                    "a name may be reused only in place (top i == bottom i)"
                )
        built = CONVERTERS.get(layer.type).factory(layer, [self.blob_shapes[b] for b in layer.bottoms], ctx)
        if len(built.top_shapes) != len(layer.tops):
            raise ConfigError(
                f"{where}{layer.describe()} makes {len(built.top_shapes)} tops but declares {len(layer.tops)}"
            )
        key = self._key(layer.name)
        self.layers[key] = built.module
        self._steps.append(_Step(layer, key, built.top_shapes, built.module.is_source))
        self._bind_params(layer, key, built.module, owners)
        for bottom in layer.bottoms:
            available.pop(bottom, None)
        for top, shape in zip(layer.tops, built.top_shapes, strict=True):
            self.blob_shapes[top] = tuple(shape)
            available[top] = None
            if built.module.is_source:
                self.input_shapes[top] = tuple(shape)
        for top, weight in zip(layer.tops, layer.top_loss_weights(), strict=False):
            if weight:
                self.loss_weights[top] = weight

    def _key(self, name: str) -> str:
        key = (name or "layer").replace(".", "_")
        while key in self.layers or hasattr(self.layers, key):
            key += "_"
        return key

    def _bind_params(
        self, layer: LayerSpec, key: str, module: CaffeLayer, owners: dict[str, _Learnable]
    ) -> None:
        """Apply ``param {}`` specs (Caffe's ``AppendParam``): multipliers and sharing by name."""
        names = module.blob_names
        if len(layer.params) > len(names):
            raise ConfigError(
                f"{layer.where}: {layer.describe()} gives {len(layer.params)} param specs but has "
                f"only {len(names)} parameter blob(s)"
            )
        for i, attr in enumerate(names):
            tensor = getattr(module, attr)
            if not isinstance(tensor, nn.Parameter):
                continue  # statistics buffers (BatchNorm) are never learned
            spec = layer.params[i] if i < len(layer.params) else ParamSpec()
            owner = owners.get(spec.name) if spec.name else None
            if owner is None:
                item = _Learnable(key, attr, f"layers.{key}.{attr}", spec.lr_mult, spec.decay_mult)
                self._learnables.append(item)
                if spec.name:
                    owners[spec.name] = item
                continue
            shared = self._parameter(owner)
            strict = spec.share_mode in (None, "STRICT", "0")
            if tuple(shared.shape) != tuple(tensor.shape):
                mode = "" if strict else " (PERMISSIVE sharing of differently shaped blobs is not supported)"
                raise ConfigError(
                    f"{layer.where}: {layer.describe()} shares param {spec.name!r} with shape "
                    f"{list(tensor.shape)}, but its owner {owner.qualname} has shape "
                    f"{list(shared.shape)}{mode}"
                )
            for field in ("lr_mult", "decay_mult"):
                mine, theirs = getattr(spec, field), getattr(owner, field)
                if mine is not None and theirs is not None and mine != theirs:
                    raise ConfigError(
                        f"{layer.where}: {layer.describe()} sets {field} {mine} on shared param "
                        f"{spec.name!r}, but it is already {theirs}"
                    )
                if mine is not None:
                    setattr(owner, field, mine)  # the first sharer that sets it wins
            setattr(module, attr, shared)

    def _parameter(self, item: _Learnable) -> nn.Parameter:
        return getattr(self.layers[item.key], item.attr)

    # ------------------------------------------------------------------ running

    @property
    def input_names(self) -> list[str]:
        return list(self.input_shapes)

    @property
    def loss_names(self) -> list[str]:
        return list(self.loss_weights)

    @property
    def caffe_layers(self) -> list[tuple[str, str]]:
        """``(layer name, type)`` of the built layers, in file order."""
        return [(step.spec.name, step.spec.type) for step in self._steps]

    def blobs_of(self, layer_name: str) -> list[torch.Tensor]:
        """The layer's live tensors in Caffe blob order and shape (copy into them to load weights)."""
        for step in self._steps:
            if step.spec.name == layer_name:
                return cast(CaffeLayer, self.layers[step.key]).caffe_blobs()  # layers holds CaffeLayers only
        raise ConfigError(
            f"no layer named {layer_name!r} in the {self.phase} net; layers: "
            f"{', '.join(name for name, _ in self.caffe_layers)}"
        )

    def forward(self, *args: torch.Tensor, **inputs: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        if len(args) > len(self.input_names):
            raise ConfigError(f"got {len(args)} positional inputs; the net takes {self.input_names}")
        for name, tensor in zip(self.input_names, args, strict=False):
            if name in inputs:
                raise ConfigError(f"input {name!r} given both by position and by name")
            inputs[name] = tensor
        extra = set(inputs) - set(self.input_names)
        if extra:
            raise ConfigError(f"unknown inputs {sorted(extra)}; the net's inputs are {self.input_names}")
        blobs: dict[str, torch.Tensor] = {}
        for step in self._steps:
            module = self.layers[step.key]
            if step.is_source:
                tops = tuple(
                    self._fed(module, i, top, step.top_shapes[i], inputs)
                    for i, top in enumerate(step.spec.tops)
                )
            else:
                tops = module(*(blobs[b] for b in step.spec.bottoms))
            blobs.update(zip(step.spec.tops, tops, strict=True))
        out = {name: blobs[name] for name in self.output_names}
        return next(iter(out.values())) if len(out) == 1 else out

    @staticmethod
    def _fed(
        module: Any, index: int, top: str, shape: Shape, inputs: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        if top in inputs:
            return inputs[top]
        generated = module.generate(index, shape)
        if generated is None:
            raise ConfigError(
                f"missing input {top!r}; pass it as net({top}=tensor) (build-time shape {list(shape)})"
            )
        fed = next(iter(inputs.values()), None)  # DummyData: follow the device of the fed data
        return generated if fed is None else generated.to(fed.device)

    def loss(self, outputs: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Caffe's objective: Σ loss_weight × sum(top) over the loss tops."""
        if not self.loss_weights:
            raise ConfigError(f"the {self.phase} net has no loss top (no *Loss layer and no loss_weight)")
        if isinstance(outputs, torch.Tensor):
            if len(self.output_names) != 1:
                raise ConfigError(
                    f"loss() needs the dict of outputs {self.output_names}, not a single tensor"
                )
            outputs = {self.output_names[0]: outputs}
        missing = [name for name in self.loss_weights if name not in outputs]
        if missing:
            raise ConfigError(f"loss tops {missing} are not among the outputs {list(outputs)}")
        return sum((w * outputs[name].sum() for name, w in self.loss_weights.items()), torch.zeros(()))

    def learnable_params(self) -> list[tuple[str, nn.Parameter, float, float]]:
        """Owned parameter blobs as ``(name, parameter, lr_mult, decay_mult)`` (unset → 1)."""
        return [
            (
                item.qualname,
                self._parameter(item),
                1.0 if item.lr_mult is None else float(item.lr_mult),
                1.0 if item.decay_mult is None else float(item.decay_mult),
            )
            for item in self._learnables
        ]

    def param_groups(self, base_lr: float, weight_decay: float = 0.0) -> list[dict[str, Any]]:
        """Optimizer param groups: ``lr = base_lr·lr_mult``, ``weight_decay = weight_decay·decay_mult``.

        Parameters with ``lr_mult: 0`` are left out (they have ``requires_grad=False``).
        Each group also carries ``lr_mult``, ``decay_mult`` and ``names``.
        """
        groups: dict[tuple[float, float], dict[str, Any]] = {}
        for name, param, lr_mult, decay_mult in self.learnable_params():
            if lr_mult == 0:
                continue
            group = groups.setdefault(
                (lr_mult, decay_mult),
                {
                    "params": [],
                    "names": [],
                    "lr": base_lr * lr_mult,
                    "weight_decay": weight_decay * decay_mult,
                    "lr_mult": lr_mult,
                    "decay_mult": decay_mult,
                },
            )
            group["params"].append(param)
            group["names"].append(name)
        return list(groups.values())

    def layer_rows(self) -> list[dict[str, Any]]:
        """Per layer: name, type, bottoms, tops, top shapes and owned parameter count."""
        counts: dict[str, int] = {}
        for item in self._learnables:
            counts[item.key] = counts.get(item.key, 0) + self._parameter(item).numel()
        return [
            {
                "name": s.spec.name,
                "type": s.spec.type,
                "bottoms": list(s.spec.bottoms),
                "tops": list(s.spec.tops),
                "top_shapes": [list(shape) for shape in s.top_shapes],
                "params": counts.get(s.key, 0),
            }
            for s in self._steps
        ]


def load_net(
    prototxt: str | os.PathLike[str] | Message | NetSpec,
    phase: str = "TRAIN",
    stages: Sequence[str] = (),
    level: int = 0,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> CaffeNet:
    """Build a :class:`CaffeNet` from a ``.prototxt`` (path or text) for one phase.

    Args:
        prototxt: path, text, parsed :class:`Message` or :class:`NetSpec`.
        phase: ``"TRAIN"`` or ``"TEST"`` (include/exclude rules, Dropout, BatchNorm).
        stages: the NetState stages (for ``stage``/``not_stage`` rules).
        level: the NetState level (for ``min_level``/``max_level`` rules).
        input_shapes: full shapes of fed blobs, e.g. ``{"data": (64, 1, 28, 28)}``; needed for
            ``Data``/``HDF5Data`` layers, whose record shapes the prototxt does not state,
            and overriding ``Input`` shapes.  A label follows the data's batch size.

    Raises:
        ConfigError: on unknown layer types, unwired blobs, bad shapes or parameters.
    """
    spec = load_net_spec(prototxt)
    return CaffeNet.from_spec(spec, phase, stages, level, input_shapes)
