"""What a ``precision`` setting means for training: the autocast context, the gradient scaler
and the compute dtype, in one place (``fit``'s loop uses it; a sharded strategy's
mixed-precision policy can read :attr:`Precision.dtype`).

* ``"32"``: float32 throughout; no context, no scaler, so the default loop does no extra work.
* ``"bf16-mixed"``: forward passes under ``torch.autocast(dtype=torch.bfloat16)`` (CPU and
  CUDA); parameters, gradients and optimizer state stay float32. bfloat16 has float32's
  exponent range, so no loss scaling is needed.
* ``"fp16-mixed"``: forward passes under ``torch.autocast(dtype=torch.float16)`` with a
  ``torch.amp.GradScaler`` (float16 gradients underflow without scaling); CUDA only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from ..config import PRECISIONS
from ..errors import ConfigError

_DTYPES = {"32": torch.float32, "bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


@dataclass(frozen=True)
class Precision:
    """A ``precision`` setting resolved for one device."""

    name: str
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        """The dtype forward passes compute in (float32 for ``"32"``)."""
        return _DTYPES[self.name]

    @property
    def mixed(self) -> bool:
        return self.name != "32"

    def autocast(self) -> AbstractContextManager[Any]:
        """The context forward passes (and the loss) run in."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def autocast_factory(self) -> Callable[[], AbstractContextManager[Any]]:
        return self.autocast

    def scaler(self) -> torch.amp.GradScaler | None:
        """A fresh gradient scaler for ``"fp16-mixed"``, else None."""
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16-mixed" else None


def resolve_precision(name: str, device: torch.device | str) -> Precision:
    """``name`` (one of :data:`~sparkdp.config.PRECISIONS`) for training on ``device``."""
    if name not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}; got {name!r}.")
    device_type = torch.device(device).type
    if name == "fp16-mixed" and device_type != "cuda":
        raise ConfigError(
            f"precision='fp16-mixed' needs a CUDA GPU (float16 autocast with loss scaling); this "
            f"worker trains on {device_type}. Use precision='bf16-mixed' on CPUs, or '32'."
        )
    return Precision(name, device_type)


__all__ = ["Precision", "resolve_precision"]
