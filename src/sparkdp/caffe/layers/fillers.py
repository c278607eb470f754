"""Caffe's weight fillers (``include/caffe/filler.hpp``), drawn from torch's global RNG.

Seed with ``torch.manual_seed`` for reproducible nets.  Two Caffe facts matter when
porting: the default filler is ``constant`` 0 (also for weights), and Caffe's
``xavier`` uses variance 1/fan_in (not ``torch.nn.init.xavier_uniform_``).
"""

from __future__ import annotations

import math

import torch

from ...errors import ConfigError
from ..spec import LayerSpec
from ..textformat import Message
from .base import CaffeLayer

FILLERS = ("constant", "uniform", "gaussian", "positive_unitball", "xavier", "msra", "bilinear")


def _fan(tensor: torch.Tensor, norm: str) -> float:
    numel = tensor.numel()
    fan_in = numel / tensor.shape[0] if tensor.dim() >= 1 and tensor.shape[0] else numel
    fan_out = numel / tensor.shape[1] if tensor.dim() >= 2 and tensor.shape[1] else numel
    return {"FAN_IN": fan_in, "FAN_OUT": fan_out, "AVERAGE": (fan_in + fan_out) / 2}[norm]


@torch.no_grad()
def fill_(
    tensor: torch.Tensor,
    filler: Message | None,
    default_value: float = 0.0,
    where: str = "",
) -> torch.Tensor:
    """Fill ``tensor`` in place as Caffe's ``GetFiller(filler)->Fill(blob)`` would.

    Args:
        tensor: the blob, in Caffe's blob shape.
        filler: the ``FillerParameter`` message, or None for the layer's default.
        default_value: ``value`` of the default constant filler (Scale uses 1).
        where: prefix for error messages (the layer).
    """
    msg = filler or Message()
    kind = str(msg.get("type", "constant"))
    value = float(msg.get("value", default_value if filler is None else 0.0))
    norm = str(msg.get("variance_norm", "FAN_IN"))
    norm = {"0": "FAN_IN", "1": "FAN_OUT", "2": "AVERAGE"}.get(norm, norm)
    if norm not in ("FAN_IN", "FAN_OUT", "AVERAGE"):
        raise ConfigError(f"{where}variance_norm must be FAN_IN, FAN_OUT or AVERAGE; got {norm!r}")
    if kind == "constant":
        tensor.fill_(value)
    elif kind == "uniform":
        tensor.uniform_(float(msg.get("min", 0.0)), float(msg.get("max", 1.0)))
    elif kind == "gaussian":
        tensor.normal_(float(msg.get("mean", 0.0)), float(msg.get("std", 1.0)))
        sparse = int(msg.get("sparse", -1))
        if sparse >= 0:  # keep each weight with probability sparse / num_outputs
            keep = sparse / tensor.shape[0] if tensor.dim() else 1.0
            tensor.mul_(torch.bernoulli(torch.full_like(tensor, min(keep, 1.0))))
    elif kind == "positive_unitball":
        tensor.uniform_(0.0, 1.0)
        if tensor.dim():  # every output row sums to one
            rows = tensor.view(tensor.shape[0], -1)
            rows.div_(rows.sum(dim=1, keepdim=True))
    elif kind == "xavier":
        bound = math.sqrt(3.0 / _fan(tensor, norm))
        tensor.uniform_(-bound, bound)
    elif kind == "msra":
        tensor.normal_(0.0, math.sqrt(2.0 / _fan(tensor, norm)))
    elif kind == "bilinear":
        _bilinear_(tensor, where)
    else:
        raise ConfigError(f"{where}unknown filler type {kind!r}; known: {', '.join(FILLERS)}")
    return tensor


def _bilinear_(tensor: torch.Tensor, where: str) -> None:
    if tensor.dim() != 4 or tensor.shape[2] != tensor.shape[3]:
        raise ConfigError(
            f"{where}the bilinear filler needs a 4-D blob with square kernels; got shape {list(tensor.shape)}"
        )
    k = tensor.shape[3]
    f = math.ceil(k / 2)
    c = (k - 1) / (2.0 * f)
    coords = torch.arange(k, dtype=torch.float64)
    line = 1 - torch.abs(coords / f - c)
    tensor.copy_((line[:, None] * line[None, :]).expand_as(tensor))


def fill_blobs(layer: LayerSpec, module: CaffeLayer, param: Message) -> None:
    """Fill a layer's learnable blobs in Caffe's blob order: ``param``'s ``bias_filler`` for
    the biases (``bias``, ``b_*``), its ``weight_filler`` for the others."""
    for name in module.blob_names:
        filler = "bias_filler" if name == "bias" or name.startswith("b_") else "weight_filler"
        fill_(getattr(module, name), param.get(filler), where=f"{layer.describe()}: ")
