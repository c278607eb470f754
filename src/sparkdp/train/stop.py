"""A request from the driver that a job stop at its next epoch boundary, and return what it did.

A hyperparameter search prunes a trial whose intermediate results are poor: the driver decides
on an epoch's results (the ``epoch`` record rank 0 sends to its monitoring hub) while the workers
train the next epoch, so the workers learn it at that epoch's end. The request is an empty file
(a local path, or an fsspec URL where executors run on other machines) that the driver creates;
at every epoch's end rank 0 looks for it once (one ``stat``) and every rank learns the answer
through the epoch's loss all-reduce, so all ranks stop after the same epoch. An asynchronous
worker (no collective to agree through) looks for itself. A streamed DataFrame's job, one stage
per epoch, is stopped by the driver itself: it starts no further epoch stage. The job then ends
as a finished one would: the model trained so far, the history of the epochs run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopNotice:
    """Where the driver posts the request (created by :meth:`post`, read by :meth:`posted`)."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: whether the workers can read ``url`` (False: a driver-local file on a cluster, read only by
    #: the driver, which stops a streamed DataFrame's job between its per-epoch stages)
    shared: bool = True

    def _fs(self) -> tuple[Any, str]:
        import fsspec

        return fsspec.core.url_to_fs(self.url, **self.storage_options)

    def post(self) -> None:
        fs, path = self._fs()
        fs.pipe_file(path, b"")

    def posted(self) -> bool:
        try:
            fs, path = self._fs()
            fs.invalidate_cache(fs._parent(path))
            return bool(fs.exists(path))
        except OSError as exc:  # an unreachable store asks for nothing; the next epoch looks again
            log.warning("could not read the stop request %s: %s", self.url, exc)
            return False

    def clear(self) -> None:
        try:
            fs, path = self._fs()
            if fs.exists(path):
                fs.rm_file(path)
        except OSError as exc:
            log.warning("could not remove the stop request %s: %s", self.url, exc)


__all__ = ["StopNotice"]
