"""The one owner of a job's checkpoints: the only code that builds a :class:`CheckpointStore`.

Every kind of job writes, rotates, lists and resumes through a :class:`CheckpointManager`: a
synchronous job's states (``train.checkpoint``, through :meth:`CheckpointPolicy.manager
<sparkdp.train.checkpoint.CheckpointPolicy.manager>`), sharded ones (``train.sharded_checkpoint``),
the parameter server's on the driver and the ``servers=K`` servers' on the executors
(:class:`ServerCheckpoints`, :meth:`CheckpointManager.load_server`), and the driver's choice of the
job a ``resume=`` continues (:meth:`CheckpointManager.jobs`, :meth:`CheckpointManager.others`).

A manager with a job identity writes that job's checkpoints; :meth:`CheckpointManager.reader`
reads every job's and writes none (the export command, resume's look-ups, a worker's sharded
restore). The store itself (names, digests, atomic commits) is ``train.checkpoint_store``'s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..config import CheckpointConfig
from ..errors import ConfigError
from .checkpoint_store import CheckpointName, CheckpointStore, parse_name, server_series

if TYPE_CHECKING:  # the server is only handed through: train/ does not need ps/ to import
    from ..ps import ParameterServer

log = logging.getLogger(__name__)

#: the identity a reading manager's store carries: it never writes, so no file carries it
_READER = "reader"


class CheckpointManager:
    """One job's checkpoints in ``directory`` (a local path or an fsspec URL): ``job_id`` names
    what it writes; None: a reader, which lists and verifies every job's checkpoints and writes
    none. ``keep``: how many of this job's checkpoints of a series rotation keeps."""

    def __init__(
        self,
        directory: str,
        job_id: str | None,
        keep: int = 3,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory, self.job_id = str(directory), job_id
        self.store = CheckpointStore(self.directory, job_id or _READER, keep, storage_options)

    @classmethod
    def of(cls, settings: CheckpointConfig, job_id: str) -> CheckpointManager:
        """The manager of job ``job_id``'s checkpoints in ``settings.checkpoint_dir``."""
        return cls(
            str(settings.checkpoint_dir),
            job_id,
            settings.keep_checkpoints,
            settings.checkpoint_storage_options,
        )

    @classmethod
    def reader(cls, directory: str, storage_options: Mapping[str, Any] | None = None) -> CheckpointManager:
        """A manager that reads every job's checkpoints in ``directory`` and writes none."""
        return cls(directory or ".", None, storage_options=storage_options)

    # ------------------------------------------------------------------ listing
    def check_writable(self) -> None:
        """Fail at the start of a job, not after an hour of training, if nothing can be saved here."""
        self.store.check_writable()

    def names(self, series: str | None = None, job_id: str | None = None) -> list[str]:
        """The committed checkpoints (of ``series``, of ``job_id``), oldest first."""
        return self.store.names(series, job_id)

    def url(self, name: str) -> str:
        return self.store.url(name)

    def jobs(self, series: Collection[str]) -> dict[str, str]:
        """Every job with checkpoints of ``series`` here, and its newest one's name."""
        newest: dict[str, str] = {}  # names are listed oldest first
        for name in self.names():
            parsed = _parsed(name)
            if parsed.series in series:
                newest[parsed.job_id] = name
        return newest

    def others(self, lineage: str | None) -> list[str]:
        """The checkpoints here (of any kind) that are not job ``lineage``'s (every one: None)."""
        return [n for n in self.names() if lineage is None or _parsed(n).job_id != lineage]

    # ------------------------------------------------------------------ writing and reading
    def save(self, series: str, position: str, payload: Any) -> str:
        """Write ``payload`` as this job's checkpoint at ``position`` of ``series``, atomically,
        then rotate the series; returns where it is."""
        if self.job_id is None:
            raise ValueError("a reading checkpoint manager writes nothing; give it the job's identity")
        return self.store.url(self.store.save(series, position, payload))

    def latest(
        self, series: str, job_id: str | None, read: Callable[[str, Any], Any]
    ) -> tuple[str, Any] | None:
        """The newest ``series`` checkpoint (of ``job_id``) that verifies and ``read`` accepts;
        damaged newer ones are skipped with a warning (``CheckpointStore.latest``)."""
        return self.store.latest(series, job_id, read)

    def load_server(self, server: ParameterServer, series: str = server_series()) -> str:
        """Load this job's newest ``series`` server checkpoint that reads and verifies into
        ``server`` and return its name; damaged newer ones are skipped with a warning, another
        job's are never read."""
        found = self.latest(series, self.job_id, lambda name, state: server.load_state_dict(state))
        if found is None:
            raise ConfigError(
                f"{self.directory!r}: no readable parameter-server checkpoint of this job "
                f"({series}-*-{self.job_id}.safetensors) there. Point resume at the checkpoint_dir "
                "of an earlier asynchronous run, or leave it unset to start afresh."
            )
        return found[0]

    def server_saver(
        self, server: ParameterServer, every_s: float, series: str = server_series()
    ) -> ServerCheckpoints:
        """A thread saving ``server``'s state every ``every_s`` seconds as this job's ``series``."""
        return ServerCheckpoints(server, self, every_s, series)


def _parsed(name: str) -> CheckpointName:
    parsed = parse_name(name)
    assert parsed is not None  # the store lists checkpoints' names only
    return parsed


class ServerCheckpoints:
    """Saves a server's state every ``every_s`` seconds from a thread, as ``series`` checkpoints of
    ``manager``'s job (the store keeps the newest ``keep_checkpoints``). Taking the state copies
    it under the server's locks; writing it happens on this thread."""

    def __init__(
        self,
        server: ParameterServer,
        manager: CheckpointManager,
        every_s: float,
        series: str = server_series(),
    ) -> None:
        self.server, self.manager, self.every_s, self.series = server, manager, every_s, series
        mine = manager.names(series, manager.job_id)
        last = parse_name(mine[-1]) if mine else None
        self.count = int(last.position) + 1 if last is not None else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdp-ps-checkpoints", daemon=True)

    def __enter__(self) -> ServerCheckpoints:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.save()
            except Exception as exc:  # a full or read-only disk: training goes on, the next period retries
                log.warning(
                    "the parameter-server checkpoint %s failed (%s: %s); training goes on and the next "
                    "save is tried in %g s",
                    self.manager.url(self.manager.store.name(self.series, self._position())),
                    type(exc).__name__,
                    exc,
                    self.every_s,
                )

    def _position(self) -> str:
        return f"{self.count:06d}"

    def save(self) -> None:
        where = self.manager.save(self.series, self._position(), self.server.state_dict())
        self.count += 1
        log.info("parameter-server checkpoint %s", where)


__all__ = ["CheckpointManager", "ServerCheckpoints"]
