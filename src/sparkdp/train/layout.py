"""The memory layout convolutional models train in: channels-last on CPU.

PyTorch stores images NCHW by default. oneDNN's CPU kernels for 2-D convolution
and max-pooling are faster on NHWC ("channels-last") tensors. On the 2-conv CNN
(batch 64, one thread, this project's 2-core machine), ``max_pool2d`` took
6.9 ms in NCHW and 0.8 ms in NHWC. A whole training step took 76 ms instead of
89 ms, and evaluating 256 images took 110 ms instead of 170 ms.

The arithmetic is the same up to float rounding (the kernels sum in another
order). The layout changes the strides of the model's 4-D weights and of the
input batches, never their shapes or values. ``"auto"`` uses channels-last only
where it is known to help and is known to work:

- the worker computes on a CPU (GPUs want it only under mixed precision);
- the model has a 4-D floating parameter, i.e. a 2-D convolution;
- the driver's preflight ran the model on a channels-last sample batch.
  User code that calls ``x.view(n, -1)`` on a convolution's output fails on
  NHWC tensors; ``"auto"`` then trains NCHW, and says so in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from ..config import check_memory_format
from ..errors import ConfigError

log = logging.getLogger(__name__)


def has_conv2d(model: nn.Module) -> bool:
    """Whether the model holds a 2-D convolution kernel (a 4-D floating parameter)."""
    return any(p.dim() == 4 and p.is_floating_point() for p in model.parameters())


def use_channels_last(memory_format: str, model: nn.Module, device: torch.device) -> bool:
    """The worker's decision for ``FitSpec.memory_format`` on ``device``."""
    if memory_format == "channels_last":
        return True
    return memory_format == "auto" and device.type == "cpu" and has_conv2d(model)


def set_layout(model: nn.Module, channels_last: bool) -> nn.Module:
    """Restride the model's 4-D parameters and buffers in place (their values are unchanged)."""
    # Module.to takes memory_format (torch's own channels-last recipe) but its overloads leave it out
    return model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)  # type: ignore[call-overload, unused-ignore]


def batch_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    if channels_last and x.dim() == 4:
        return x.to(memory_format=torch.channels_last)  # contiguous() keeps a 1-channel batch NCHW
    return x


def preflight_layout(memory_format: str, model: nn.Module, run: Callable[[Callable], None]) -> str:
    """Check on the driver that the model runs channels-last; returns the format workers use.

    ``run(to_batch)`` must run the model on a small batch after applying ``to_batch`` to
    the features. An explicit ``"channels_last"`` that fails is the user's error;
    ``"auto"`` falls back to ``"contiguous"``.
    """
    if check_memory_format(memory_format) == "contiguous" or not has_conv2d(model):
        return memory_format
    originals = [t.data for t in (*model.parameters(), *model.buffers())]
    set_layout(model, True)
    try:
        run(lambda x: batch_layout(x, True))
    except (RuntimeError, ConfigError) as exc:
        if memory_format == "channels_last":
            raise ConfigError(
                f"the model cannot run with memory_format='channels_last': {exc}. Use "
                "reshape() instead of view() on convolution outputs, or memory_format='contiguous'."
            ) from exc
        log.info("the model does not run channels-last (%s); training in the default NCHW layout", exc)
        return "contiguous"
    finally:  # the user's tensors back, exactly as they were
        for t, original in zip((*model.parameters(), *model.buffers()), originals):
            t.data = original
    return memory_format
