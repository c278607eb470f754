"""A barrier stage's rendezvous through the driver, where every executor runs on the driver's
machine: each task posts its part (rank 0's store port, its host and GPU) to an authenticated
endpoint of the driver and gets every part back as soon as the last one arrives.

Spark's ``BarrierTaskContext.allGather`` looks for its answer once a second (Spark 4.3's
``runBarrier`` sleeps 1,000 ms between checks), so it adds about a second to the start of every
synchronous job, however close together its tasks arrive (docs/benchmarks.md, "The time outside
training"). The board is the monitoring endpoint's transport (:mod:`sparkdp.ps.transport`: an
HMAC handshake with a secret that travels inside the job, JSON records, nothing unpickled) bound
to the loopback address, so it serves local masters only; elsewhere the stage keeps ``allGather``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError

#: seconds the board holds a task's question before answering "still waiting" (the task asks again)
HOLD_S = 5.0
#: the record kind of a rendezvous question
KIND = "rendezvous"


class RendezvousBoard:
    """The driver's side, for one stage of ``world_size`` tasks; a context manager (it listens
    from ``__enter__`` to ``__exit__``)."""

    def __init__(self, world_size: int, host: str = "127.0.0.1") -> None:
        self.world_size, self._host = world_size, host
        #: each stage attempt's parts, by rank (a retried stage posts under another attempt)
        self._parts: dict[str, dict[int, Any]] = {}
        self._changed = threading.Condition()
        self._endpoint: Any = None

    def __enter__(self) -> RendezvousBoard:
        from ..ps.transport.tcp import TcpTransport

        self._endpoint = TcpTransport().serve(None, host=self._host, reports=self._answer)
        return self

    def __exit__(self, *exc: object) -> None:
        self._endpoint.close()

    @property
    def link(self) -> BoardLink:
        return BoardLink(self._endpoint.info, self.world_size)

    def _answer(self, worker: int, record: dict[str, Any]) -> dict[str, Any] | None:
        """One task's question: its part (or None when asking again); every part once all are in."""
        if record.get("kind") != KIND:
            return None
        attempt, part = record.get("attempt"), record.get("part")
        if not isinstance(attempt, str) or not 0 <= worker < self.world_size:
            raise ProtocolError(f"a rendezvous question from task {worker} of {self.world_size}: {record!r}")
        with self._changed:
            parts = self._parts.setdefault(attempt, {})
            if part is not None:
                parts[worker] = part
                self._changed.notify_all()
            self._changed.wait_for(lambda: len(parts) == self.world_size, timeout=HOLD_S)
            if len(parts) < self.world_size:
                return {"waiting": len(parts)}
            return {"parts": [parts[rank] for rank in range(self.world_size)]}


@dataclass(frozen=True)
class BoardLink:
    """Where a task finds the board (built by the driver, shipped inside the job)."""

    info: Any  # sparkdp.ps.transport.base.ConnectInfo (its repr hides the secret)
    world_size: int

    def gather(self, rank: int, attempt: str, part: Any) -> list[Any]:
        """Every task's ``part``, by rank, once all ``world_size`` tasks of ``attempt`` posted theirs.
        Waits as long as Spark's ``allGather`` would: until the stage ends the task."""
        from ..ps.transport.tcp import TcpTransport

        client = TcpTransport().connect(self.info.address, self.info.secret, rank, timeout=30.0)
        try:
            answer = client.ask({"kind": KIND, "attempt": attempt, "part": part})
            while "parts" not in answer:
                answer = client.ask({"kind": KIND, "attempt": attempt, "part": None})
            parts = answer["parts"]
        finally:
            client.close()
        if not isinstance(parts, list) or len(parts) != self.world_size:
            raise ProtocolError(f"the driver's rendezvous board answered {answer!r}")
        return parts
