"""Collectives for the synchronous strategies: torch.distributed, or a no-op for one process."""

from .base import Collective
from .single import SingleProcessCollective
from .torch_dist import TorchCollective

__all__ = ["Collective", "SingleProcessCollective", "TorchCollective"]
