"""The interface between data sources and trainers."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch


class WorkerData(ABC):
    """A picklable description of a dataset that each worker turns into its own batches.

    It is shipped to every Spark task; :meth:`batches` runs there and yields this
    rank's share of one epoch as ``(features, labels)`` tensor pairs.
    """

    #: True when every rank is guaranteed the same number of batches per epoch, so the
    #: synchronous loop needs no per-step "anyone out of data?" check.
    equal_batches: bool = False

    @abstractmethod
    def batches(
        self, *, rank: int, world_size: int, epoch: int, batch_size: int, seed: int, shuffle: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield this rank's batches of ``epoch``."""

    def eval_batches(
        self, *, rank: int, world_size: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's share of the data for evaluation: every row exactly once over all ranks."""
        return self.batches(
            rank=rank, world_size=world_size, epoch=0, batch_size=batch_size, seed=0, shuffle=False
        )

    def num_samples(self) -> int | None:
        """Total rows, when known without reading the data."""
        return None

    def describe(self) -> str:
        return type(self).__name__

    def shareable_bytes(self) -> int:
        """Bytes this description carries in memory that same-machine workers could map from
        shared files instead of unpickling a copy each (``data.shared``). Default: none."""
        return 0

    def shared(self, store) -> WorkerData:
        """This data backed by files in ``store`` (a ``data.shared.SharedTensorDir``). Default: itself."""
        return self
