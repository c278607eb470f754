"""Fewer bytes for what the synchronous strategies send (docs/algorithms.md §10).

A *codec* decides how a flat float32 vector travels: ``"none"`` (float32), ``"bf16"``,
``"fp16"`` or ``"int8"`` (blocks of :data:`INT8_BLOCK` values, gathered); lossy codecs carry
**error feedback**. What each sends and why error feedback bounds the drift: docs/algorithms.md
§10, Codecs and Error feedback. The codecs here are plain tensor math; :class:`DeltaReducer` runs them over a
:class:`~sparkdp.comm.base.Collective`.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from ..comm.base import Collective, Pending
from ..errors import ConfigError
from .base import ring_bytes

CODECS = ("none", "bf16", "fp16", "int8")
#: the half-precision codecs and the dtype each sends
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: values that share one int8 scale: small enough that one outlier costs little precision,
#: large enough that the scales add 0.4 % to the bytes
INT8_BLOCK = 1024


def check_codec(name: object, allowed: tuple[str, ...] = CODECS) -> str:
    """``name`` if it is one of ``allowed``; else a ConfigError listing them."""
    if name is None:
        return "none"
    if name not in allowed:
        raise ConfigError(f"compression must be one of {', '.join(repr(a) for a in allowed)}; got {name!r}.")
    return str(name)


def quantize_int8(flat: torch.Tensor, block: int = INT8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``flat`` to int8 with one scale (largest magnitude / 127) per ``block`` values.

    Returns the int8 values (padded to whole blocks) and the float32 scales."""
    block = _block(flat.numel(), block)
    blocks = -(-flat.numel() // block)
    padded = torch.zeros(blocks * block, dtype=torch.float32, device=flat.device)
    padded[: flat.numel()] = flat
    rows = padded.view(blocks, block)
    scales = rows.abs().amax(dim=1) / 127.0
    scales[scales == 0] = 1.0  # an all-zero block: any scale gives zeros
    values = torch.round(rows / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return values.view(-1), scales


def _block(numel: int, block: int) -> int:
    """A vector shorter than one block is one block of its own length (no padding sent)."""
    return max(1, min(block, numel))


def dequantize_int8(values: torch.Tensor, scales: torch.Tensor, numel: int) -> torch.Tensor:
    """The float32 vector :func:`quantize_int8` encoded (its first ``numel`` values)."""
    rows = values.view(scales.numel(), -1).to(torch.float32) * scales[:, None]
    return rows.view(-1)[:numel]


def wire_bytes(codec: str, numel: int, world: int) -> int:
    """Bytes one rank sends (and receives) to reduce ``numel`` float32 values with ``codec``."""
    if codec == "int8":  # a ring all-gather: every other rank's values and scales pass through
        block = _block(numel, INT8_BLOCK)
        blocks = -(-numel // block)
        return (world - 1) * (blocks * block + 4 * blocks)
    return ring_bytes(numel * (2 if codec in HALF_DTYPES else 4), world)


class DeltaReducer:
    """Sums a flat float32 vector over the ranks through one codec, keeping this rank's
    error-feedback residual per ``key`` (one per fragment of the model).

    :meth:`start` begins the reduction and returns a :class:`Pending` whose ``wait()`` gives
    the sum in float32, so callers may overlap it with computation."""

    def __init__(self, codec: str) -> None:
        self.codec = check_codec(codec)
        self.residuals: dict[Hashable, torch.Tensor] = {}

    def start(self, collective: Collective, flat: torch.Tensor, key: Hashable = 0) -> Pending:
        if self.codec == "none":
            return collective.start_all_reduce(flat, "sum")
        residual = self.residuals.get(key)
        corrected = flat if residual is None else flat + residual
        if self.codec == "int8":
            values, scales = quantize_int8(corrected)
            self.residuals[key] = corrected - dequantize_int8(values, scales, flat.numel())
            gathered = collective.start_all_gather(torch.cat([values, scales.view(torch.int8)]))
            split = values.numel()

            def total() -> torch.Tensor:
                parts = gathered.wait()
                out = torch.zeros_like(flat)
                for part in parts:
                    # the scales start at any byte offset; a copy aligns them for the float32 view
                    out += dequantize_int8(
                        part[:split], part[split:].clone().view(torch.float32), flat.numel()
                    )
                return out

            return Pending(total)
        sent = corrected.to(HALF_DTYPES[self.codec])
        self.residuals[key] = corrected - sent.to(torch.float32)
        pending = collective.start_all_reduce(sent, "sum")
        return Pending(lambda: pending.wait().to(torch.float32))

    def wire_bytes(self, numel: int, world: int) -> int:
        return wire_bytes(self.codec, numel, world)

    def reset(self) -> None:
        """Forget the residuals (a fresh start: a restart or a resumed checkpoint)."""
        self.residuals.clear()
