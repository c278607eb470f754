"""Collectives: torch.distributed for synchronous jobs; identity ones for one process or async workers."""

from .base import Collective
from .single import IndependentCollective, SingleProcessCollective
from .torch_dist import TorchCollective

__all__ = ["Collective", "IndependentCollective", "SingleProcessCollective", "TorchCollective"]
