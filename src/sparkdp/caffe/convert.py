"""Convert Caffe weights to a plain PyTorch state dict (safetensors) and back.

``sparkdp caffe convert`` is the command line of these two functions:

* :func:`convert_to_safetensors` builds the net of a ``.prototxt`` (:func:`~sparkdp.caffe.load_net`),
  loads a ``.caffemodel`` into it (:func:`~sparkdp.caffe.load_weights`) and writes the module's
  ``state_dict()`` as a ``.safetensors`` file, with metadata saying which net it belongs to
  and how to load it.  Nothing is pickled, so loading the file runs no code.
* :func:`convert_to_caffemodel` loads such a state dict back into the built net (strictly:
  every key and shape must match) and writes the net's blobs as a ``.caffemodel``
  (:func:`~sparkdp.caffe.save_weights`), for Caffe or any tool that reads its format.

Both write through :func:`sparkdp.files.atomic_write`: a failed conversion leaves an
existing output file as it was.

Example:
    >>> import os, tempfile
    >>> from safetensors.torch import load_file
    >>> from sparkdp.caffe import convert_to_caffemodel, convert_to_safetensors, load_net, save_weights
    >>> tiny = ('input: "data" input_shape { dim: 1 dim: 3 } layer { name: "ip" type: "InnerProduct" '
    ...         'bottom: "data" top: "ip" inner_product_param { num_output: 2 '
    ...         'weight_filler { type: "xavier" } } }')
    >>> folder = tempfile.mkdtemp()
    >>> caffemodel = save_weights(load_net(tiny, phase="TEST"), os.path.join(folder, "tiny.caffemodel"))
    >>> result = convert_to_safetensors(tiny, os.path.join(folder, "tiny.safetensors"), weights=caffemodel)
    >>> result.tensors, result.loaded
    (2, ('ip',))
    >>> net = load_net(tiny, phase="TEST")        # the module the state dict loads into
    >>> net.load_state_dict(load_file(result.path))
    <All keys matched successfully>
    >>> back = convert_to_caffemodel(tiny, result.path, os.path.join(folder, "again.caffemodel"))
    >>> back.loaded, back.tensors, back.values
    (('ip',), 2, 8)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ConfigError
from ..files import atomic_write
from .inspect import resolve_input_shapes
from .net import CaffeNet, load_net
from .spec import NetSpec, is_prototxt_path, load_net_spec
from .textformat import Message
from .weights import WeightsMismatchError, check_directory, load_weights, save_weights

__all__ = ["ConvertResult", "convert_to_caffemodel", "convert_to_safetensors", "load_hint"]

META_PREFIX = "sparkdp."


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote.

    Attributes:
        path: the file written.
        tensors: number of tensors (safetensors) or blobs (``.caffemodel``) written.
        values: their total number of elements.
        loaded: net layers whose weights came from the source file; empty when no weights
            were given and the prototxt's fillers initialised the net.
        ignored: ``.caffemodel`` layers that the net does not have (Caffe ignores them too).
        metadata: the safetensors metadata written (to ``.safetensors``) or read (from it).
        net_name: the net's ``name`` in the prototxt.
    """

    path: Path
    tensors: int
    values: int
    loaded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    net_name: str = ""


def _build(
    prototxt: str | os.PathLike[str] | Message | NetSpec,
    phase: str,
    stages: Sequence[str],
    input_shape: Sequence[int] | None,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[CaffeNet, dict[str, tuple[int, ...]]]:
    spec = load_net_spec(prototxt)
    shapes = resolve_input_shapes(spec, phase, stages, input_shape, input_shapes)
    return load_net(spec, phase=phase, stages=stages, input_shapes=shapes), shapes


def _prototxt_label(prototxt: object) -> str:
    """The file name to show in the loading hint (the text of an inline net has none)."""
    if is_prototxt_path(prototxt):
        return os.path.basename(os.fspath(prototxt))
    return "NET.prototxt"


def load_hint(
    prototxt: str,
    path: str,
    phase: str,
    stages: Sequence[str] = (),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """The Python lines that rebuild the module and load a converted state dict into it."""
    args = [repr(prototxt), f"phase={phase!r}"]
    if stages:
        args.append(f"stages={list(stages)!r}")
    if input_shapes:
        shapes = {name: tuple(int(d) for d in shape) for name, shape in input_shapes.items()}
        args.append(f"input_shapes={shapes!r}")
    return (
        "from safetensors.torch import load_file; from sparkdp.caffe import load_net; "
        f"net = load_net({', '.join(args)}); net.load_state_dict(load_file({path!r}))"
    )


def _plain_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, and no two entries sharing memory (safetensors refuses shared tensors).

    Parameters shared by name in the prototxt appear under every layer that uses them;
    each alias is stored as its own copy, so ``load_state_dict`` finds every key.
    """
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, tensor in state.items():
        plain = tensor.detach().to("cpu").contiguous()
        pointer = plain.untyped_storage().data_ptr()
        if pointer in seen and plain.numel():
            plain = plain.clone()
        seen.add(plain.untyped_storage().data_ptr())
        out[key] = plain
    return out


def convert_to_safetensors(
    prototxt: str | os.PathLike[str] | Message | NetSpec,
    out: str | os.PathLike[str],
    *,
    weights: str | os.PathLike[str] | None = None,
    phase: str = "TEST",
    stages: Sequence[str] = (),
    input_shape: Sequence[int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ConvertResult:
    """Write the ``state_dict()`` of a Caffe net (with ``.caffemodel`` weights) as safetensors.

    The file loads into the module that ``sparkdp.caffe.load_net(prototxt, phase=phase)``
    builds (with the same ``stages`` and input shapes); its metadata records the net's
    name, the prototxt's file name, the phase, stages, input shapes, the weights file, the
    sparkdp version and that loading line (``sparkdp.load``).

    Args:
        prototxt: the net definition (path or text).
        out: the ``.safetensors`` file to write (atomically; its directory must exist).
        weights: a ``.caffemodel`` to load first (strictly: every layer with blobs must be
            in it); without one, the weights are the prototxt's filler initialisation.
        phase: which phase's layers to build, ``"TEST"`` (default) or ``"TRAIN"``.
        stages: NetState stages for include/exclude rules.
        input_shape: shape of the first input (needed for ``Data``-like layers).
        input_shapes: shapes by input name, e.g. ``{"data": (10, 4), "label": (10,)}``.

    Returns:
        A :class:`ConvertResult`.

    Raises:
        ConfigError: the net does not build, the weights do not fit it
            (:class:`~sparkdp.caffe.weights.WeightsMismatchError`), or a file cannot be read
            or written.  ``out`` is then left as it was.

    Example:
        >>> import os, tempfile
        >>> from sparkdp.caffe import convert_to_safetensors
        >>> tiny = ('input: "x" input_shape { dim: 2 dim: 3 } layer { name: "ip" type: "InnerProduct" '
        ...         'bottom: "x" top: "y" inner_product_param { num_output: 4 } }')
        >>> out = os.path.join(tempfile.mkdtemp(), "tiny.safetensors")
        >>> convert_to_safetensors(tiny, out).metadata["sparkdp.load"]    # no weights: the fillers' values
        "from safetensors.torch import load_file; ...; net = load_net('NET.prototxt', phase='TEST'); ..."
    """
    from safetensors.torch import save_file

    from .. import __version__

    out = Path(out)
    if weights is not None and os.fspath(weights).endswith(".safetensors"):
        raise ConfigError(
            f"--weights {os.fspath(weights)!r} is a safetensors file, but converting to safetensors reads a "
            ".caffemodel; to turn a safetensors state dict into a .caffemodel, use --to-caffemodel "
            "(convert_to_caffemodel)."
        )
    check_directory(out, "write safetensors file")
    phase = str(phase).upper()
    net, shapes = _build(prototxt, phase, stages, input_shape, input_shapes)
    loaded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    if weights is not None:
        summary = load_weights(net, weights, strict=True)
        loaded, ignored = summary.loaded, summary.ignored
    tensors = _plain_tensors(net.state_dict())
    label = _prototxt_label(prototxt)
    metadata = {
        "format": "pt",
        f"{META_PREFIX}version": __version__,
        f"{META_PREFIX}net_name": net.name,
        f"{META_PREFIX}prototxt": label,
        f"{META_PREFIX}phase": phase,
        f"{META_PREFIX}stages": json.dumps(list(stages)),
        f"{META_PREFIX}input_shapes": json.dumps({k: list(v) for k, v in shapes.items()}),
        f"{META_PREFIX}weights": os.path.basename(os.fspath(weights)) if weights is not None else "",
        f"{META_PREFIX}load": load_hint(label, out.name, phase, stages, shapes),
    }
    atomic_write(out, lambda tmp: save_file(tensors, tmp, metadata=metadata), make_dirs=False)
    return ConvertResult(
        out, len(tensors), sum(t.numel() for t in tensors.values()), loaded, ignored, metadata, net.name
    )


def _read_safetensors(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    label = os.fspath(path)
    if label.endswith(".caffemodel"):
        raise ConfigError(
            f"--weights {label!r} is a .caffemodel, but converting to a .caffemodel reads a safetensors "
            "state dict; to turn a .caffemodel into safetensors, use --out (convert_to_safetensors)."
        )
    if not os.path.isfile(label):
        raise ConfigError(f"cannot read safetensors file {label!r}: no such file")
    try:
        with safe_open(label, framework="pt") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}, dict(handle.metadata() or {})
    except Exception as err:  # safetensors raises its own SafetensorError, OSError, ValueError…
        raise ConfigError(f"cannot read safetensors file {label!r}: {err}") from err


def _common_prefix(tensors: Mapping[str, torch.Tensor], live: Mapping[str, torch.Tensor]) -> str:
    """The prefix (``"module."``, ``"net."``…) before every file key that makes it a net key, if any."""
    first = next(iter(tensors), "")
    for i in range(1, len(first)):
        prefix = first[:i]
        if first[i - 1] == "." and all(k.startswith(prefix) and k[i:] in live for k in tensors):
            return prefix
    return ""


def _load_state(
    net: CaffeNet, tensors: Mapping[str, torch.Tensor], label: str, meta: Mapping[str, str]
) -> None:
    """``load_state_dict`` with every mismatch listed, and aliases of shared parameters accepted.

    A parameter shared by name lives under several keys; the file may hold all of them
    (as :func:`convert_to_safetensors` writes) or only one (as ``safetensors.torch.save_model``
    writes).  Aliases present together must be equal.
    """
    live = net.state_dict(keep_vars=True)
    aliases: dict[int, list[str]] = {}
    for key, tensor in live.items():
        aliases.setdefault(id(tensor), []).append(key)
    problems = [
        f"unexpected key {key!r} (shape {list(tensors[key].shape)}): the net has no such tensor"
        for key in tensors
        if key not in live
    ]
    full: dict[str, torch.Tensor] = {}
    for key, tensor in live.items():
        present = [k for k in aliases[id(tensor)] if k in tensors]
        if not present:
            problems.append(f"missing key {key!r} (shape {list(tensor.shape)}): the file has no such tensor")
            continue
        given = tensors[key] if key in tensors else tensors[present[0]]
        if tuple(given.shape) != tuple(tensor.shape):
            if key in tensors:
                problems.append(
                    f"key {key!r}: the net expects shape {list(tensor.shape)}, "
                    f"the file has {list(given.shape)}"
                )
            continue
        if key in tensors and present[0] != key and not torch.equal(tensors[present[0]], given):
            problems.append(
                f"key {key!r} shares its parameter with {present[0]!r}, but the file's values differ"
            )
            continue
        full[key] = given
    if problems:
        listing = "\n  - ".join(problems)
        origin = ", ".join(
            f"{what} {meta[META_PREFIX + key]}"
            for key, what in (("net_name", "net"), ("phase", "phase"), ("input_shapes", "input shapes"))
            if meta.get(META_PREFIX + key)
        )
        prefix = _common_prefix(tensors, live)
        if prefix:
            listing += (
                f"\n  (every key of the file is a key of the net behind the prefix {prefix!r}, as a wrapper "
                "module saves it: strip that prefix from the keys)"
            )
        raise WeightsMismatchError(
            f"cannot load {label}: {len(problems)} mismatch(es); nothing was loaded:\n  - {listing}\n"
            "Check that the file holds the state dict of this prototxt built with the same phase, "
            "stages and input shapes" + (f" (the file's metadata says: {origin})." if origin else ".")
        )
    net.load_state_dict(full, strict=True)


def convert_to_caffemodel(
    prototxt: str | os.PathLike[str] | Message | NetSpec,
    weights: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    phase: str = "TEST",
    stages: Sequence[str] = (),
    input_shape: Sequence[int] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ConvertResult:
    """Load a safetensors state dict into the built net and write its blobs as a ``.caffemodel``.

    Loading is strict and all-or-nothing: a key the net lacks, a tensor the file lacks or a
    shape that differs is an error that lists every mismatch
    (:class:`~sparkdp.caffe.weights.WeightsMismatchError`).

    Args:
        prototxt: the net definition (path or text).
        weights: the ``.safetensors`` state dict, e.g. from :func:`convert_to_safetensors`
            or ``safetensors.torch.save_file(net.state_dict(), ...)`` after fine-tuning.
        out: the ``.caffemodel`` to write (atomically; its directory must exist).
        phase, stages, input_shape, input_shapes: how to build the net, as for
            :func:`convert_to_safetensors`.

    Returns:
        A :class:`ConvertResult` (``metadata`` is that of the safetensors file read).

    Example:
        >>> import os, tempfile
        >>> from safetensors.torch import save_file
        >>> from sparkdp.caffe import convert_to_caffemodel, load_net
        >>> tiny = ('input: "x" input_shape { dim: 2 dim: 3 } layer { name: "ip" type: "InnerProduct" '
        ...         'bottom: "x" top: "y" inner_product_param { num_output: 4 } }')
        >>> folder = tempfile.mkdtemp()
        >>> save_file(load_net(tiny, phase="TEST").state_dict(), os.path.join(folder, "tuned.safetensors"))
        >>> convert_to_caffemodel(tiny, os.path.join(folder, "tuned.safetensors"),
        ...                       os.path.join(folder, "tuned.caffemodel")).values
        16
    """
    out = Path(out)
    check_directory(out, "write .caffemodel")
    phase = str(phase).upper()
    net, _ = _build(prototxt, phase, stages, input_shape, input_shapes)
    tensors, meta = _read_safetensors(weights)
    _load_state(net, tensors, repr(os.fspath(weights)), meta)
    save_weights(net, out, name=net.name)
    blobs = [blob for name, _ in net.caffe_layers for blob in net.blobs_of(name)]
    with_blobs = tuple(dict.fromkeys(name for name, _ in net.caffe_layers if net.blobs_of(name)))
    return ConvertResult(out, len(blobs), sum(b.numel() for b in blobs), with_blobs, (), meta, net.name)
