"""Load ``.caffemodel`` weights into a Caffe net module, and save them back.

The module only needs Caffe's view of itself: ``caffe_layers`` (``(name, type)``
pairs in file order) and ``blobs_of(name)`` (live tensors in Caffe blob order and
shape), which :class:`sparkdp.caffe.net.CaffeNet` provides.

Matching follows ``Net::CopyTrainedLayersFrom``: by layer name; file layers the
net lacks are ignored (and reported); blob counts must agree; shapes must be
equal, except legacy 4-D blobs (V1 files) which compare right-aligned
(``(1,1,N,K)`` fits an ``(N,K)`` weight).  BatchNorm's three blobs are Caffe's
raw accumulators and are copied unchanged.  Unlike Caffe, loading is
all-or-nothing: every layer is checked first and one error lists every mismatch.

Example:
    >>> import os, tempfile, torch
    >>> from sparkdp.caffe import load_net
    >>> prototxt = ('input: "data" input_shape { dim: 1 dim: 3 } layer { name: "ip" type: "InnerProduct" '
    ...             'bottom: "data" top: "ip" inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }')
    >>> trained, fresh = load_net(prototxt), load_net(prototxt)
    >>> path = save_weights(trained, os.path.join(tempfile.mkdtemp(), "tiny.caffemodel"))
    >>> load_weights(fresh, path).loaded
    ('ip',)
    >>> torch.equal(fresh(data=torch.ones(1, 3)), trained(data=torch.ones(1, 3)))
    True
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..files import atomic_write
from . import caffemodel
from .caffemodel import CaffeLayerBlobs, DecodedNet, decode_net, write_caffemodel

__all__ = ["LoadSummary", "WeightsMismatchError", "load_weights", "save_weights"]


class WeightsMismatchError(ConfigError):
    """The file's blobs do not fit the net; nothing was loaded."""


@dataclass(frozen=True)
class LoadSummary:
    """What :func:`load_weights` did.

    Attributes:
        loaded: net layers whose blobs were copied from the file.
        ignored: file layers with no layer of that name in the net (Caffe ignores them).
        missing: net layers with blobs that the file lacks (only with ``strict=False``).
        version: the file's format ("V2", "V1" or "V0"; "" if given decoded layers).
    """

    loaded: tuple[str, ...]
    ignored: tuple[str, ...]
    missing: tuple[str, ...]
    version: str = ""


def _fits(target: tuple[int, ...], blob: np.ndarray, legacy: bool) -> bool:
    if not legacy:
        return tuple(blob.shape) == target
    # Blob::ShapeEquals for legacy protos: the net's shape padded with leading 1s.
    return len(target) <= 4 and (1,) * (4 - len(target)) + target == tuple(blob.shape)


def check_directory(path: Path, doing: str) -> None:
    """Raise ``cannot {doing} PATH: directory ... does not exist.`` unless ``path``'s directory exists."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ConfigError(f"cannot {doing} {str(path)!r}: directory {str(directory)!r} does not exist.")


def _read(source: Any) -> tuple[list[CaffeLayerBlobs], str, str]:
    """(layers, version, label for messages) from a path, DecodedNet or layer list."""
    if isinstance(source, DecodedNet):
        return source.layers, source.version, "the given net"
    if isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        decoded = decode_net(caffemodel.read_bytes(label, ".caffemodel"), label)
        return decoded.layers, decoded.version, label
    if isinstance(source, Iterable):
        return list(source), "", "the given layers"
    raise ConfigError(
        f"cannot load weights from a {type(source).__name__}; pass a .caffemodel path, a "
        "DecodedNet or a list of CaffeLayerBlobs."
    )


def load_weights(module: Any, source: Any, *, strict: bool = True) -> LoadSummary:
    """Copy a ``.caffemodel``'s blobs into ``module``, all or nothing.

    Args:
        module: a net with ``caffe_layers`` and ``blobs_of`` (e.g. ``CaffeNet``).
        source: a ``.caffemodel`` path, a :class:`DecodedNet` or a list of
            :class:`CaffeLayerBlobs`.
        strict: if True, a net layer with blobs that the file lacks is an error;
            if False it keeps its current values and is listed in ``missing``.

    Returns:
        A :class:`LoadSummary`.

    Raises:
        WeightsMismatchError: listing every mismatched layer (name, expected shape,
            file shape); the module is left unchanged.
        CaffemodelError: the file is truncated or corrupt.
    """
    file_layers, version, label = _read(source)
    by_name: dict[str, CaffeLayerBlobs] = {}
    for layer in file_layers:  # every file layer is copied in turn: the last one wins
        by_name[layer.name] = layer
    net_layers = list(module.caffe_layers)
    net_names = {name for name, _ in net_layers}
    ignored = tuple(dict.fromkeys(layer.name for layer in file_layers if layer.name not in net_names))

    problems: list[str] = []
    plan: list[tuple[torch.Tensor, np.ndarray]] = []
    loaded: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    for name, ltype in net_layers:
        if name in seen:  # Caffe copies into the first net layer of that name only
            continue
        seen.add(name)
        targets = list(module.blobs_of(name))
        found = by_name.get(name)
        if found is None or (not found.blobs and targets):
            if targets:
                missing.append(name)
            continue
        if len(found.blobs) != len(targets):
            problems.append(
                f"layer {name!r} ({ltype}): the net has {len(targets)} blob(s), the file has "
                f"{len(found.blobs)} (file type {found.type or '?'})"
            )
            continue
        legacy = list(found.legacy_4d) + [False] * (len(found.blobs) - len(found.legacy_4d))
        ok = True
        for i, (target, blob, is_legacy) in enumerate(zip(targets, found.blobs, legacy, strict=True)):
            want = tuple(target.shape)
            if _fits(want, blob, is_legacy):
                plan.append((target, blob))
            else:
                ok = False
                kind = " (legacy 4-D, compared right-aligned)" if is_legacy else ""
                problems.append(
                    f"layer {name!r} ({ltype}) blob {i}: the net expects shape {list(want)}, the file "
                    f"has {list(blob.shape)}{kind}"
                )
        if ok and targets:
            loaded.append(name)
    if strict and missing:
        problems += [
            f"layer {name!r}: the net has {len(module.blobs_of(name))} blob(s) but the file has "
            "no such layer (or no blobs for it)"
            for name in missing
        ]
    if problems:
        listing = "\n  - ".join(problems)
        raise WeightsMismatchError(
            f"cannot load weights from {label}: {len(problems)} mismatch(es); nothing was loaded:\n"
            f"  - {listing}\nCheck that the .caffemodel was trained with this prototxt (layer names "
            "and num_output must agree); pass strict=False to allow layers missing from the file."
        )
    with torch.no_grad():
        for target, blob in plan:
            target.copy_(torch.from_numpy(blob).reshape(target.shape))
    return LoadSummary(tuple(loaded), ignored, tuple(missing) if not strict else (), version)


def save_weights(module: Any, path: str | os.PathLike[str], *, name: str = "") -> Path:
    """Write ``module``'s blobs as a V2 ``.caffemodel``, atomically.

    Written through :func:`sparkdp.files.atomic_write`, so an existing good file is
    never left half-written.
    Every net layer is stored (blob-less ones too, as Caffe does), blobs as float32.

    Args:
        module: a net with ``caffe_layers`` and ``blobs_of``.
        path: destination; its directory must exist.
        name: the NetParameter ``name`` to record.

    Returns:
        The destination path.
    """
    path = Path(path)
    check_directory(path, "save weights to")
    layers = []
    for lname, ltype in module.caffe_layers:
        blobs = [t.detach().to("cpu", torch.float32).contiguous().numpy() for t in module.blobs_of(lname)]
        layers.append(CaffeLayerBlobs(lname, ltype, blobs, [False] * len(blobs)))

    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            write_caffemodel(handle, layers, name)

    atomic_write(path, write, make_dirs=False)
    return path
