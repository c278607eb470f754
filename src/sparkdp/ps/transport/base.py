"""The transport interface: how a worker reaches the parameter server.

Typical use (driver, then each Spark task)::

    endpoint = TcpTransport().serve(server, host=driver_host)   # port 0: the OS picks
    info = endpoint.info                                           # ConnectInfo: address, secret, tls_cert
    ...                                                            # ship `info` to the tasks
    with TcpTransport().connect(info.address, info.secret, worker_id, tls_cert=info.tls_cert) as client:
        versions, center = client.pull()
        ack = client.push(seq, versions, grads, num_samples=64)
    endpoint.close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from torch import Tensor

from sparkdp.errors import EnvironmentProblem
from sparkdp.ps.server import ParameterServer, Pulled, PushAck


class ConnectFailed(EnvironmentProblem, ConnectionError):
    """The worker could not reach the parameter server (message names the address)."""


@dataclass(frozen=True)
class ConnectInfo:
    """Everything a task needs to connect; built by the driver, shipped to the tasks.

    The secret is excluded from ``repr`` so that it does not end up in logs.
    """

    address: str
    secret: bytes
    tls_cert: str | None = None  # PEM of the server's self-signed certificate when TLS is on

    def __repr__(self) -> str:
        return f"ConnectInfo(address={self.address!r}, secret=<{len(self.secret)} bytes>, tls={self.tls_cert is not None})"


_E = TypeVar("_E", bound="Endpoint")


class Endpoint(ABC):
    """A running server side; closing it stops accepting and ends every connection."""

    info: ConnectInfo  # what a client needs to connect (set by the implementation)

    @property
    def address(self) -> str:
        return self.info.address

    @abstractmethod
    def close(self) -> None:
        """Idempotent; returns once the serving threads have ended (or a bounded wait passed)."""

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(ABC):
    """One worker's connection.  Not for concurrent use from several threads."""

    worker_id: int
    #: Number of shards (length of the versions lists).
    num_shards: int
    #: The last push seq the server applied for this worker when we connected (-1: none);
    #: a restarted task continues at ``last_seq + 1``.
    last_seq: int

    @abstractmethod
    def pull(self, *, out: Sequence[Tensor] | None = None, observe: bool = False) -> Pulled:
        """The whole centre: ``(versions per shard, parameter-shaped tensors)``.

        With ``out`` the centre is copied into those tensors (e.g. reusable buffers).
        ``observe``: look at the centre without it counting as this worker's pull (no
        staleness record, no rule hook): worker 0 evaluates the centre on its own connection."""

    @abstractmethod
    def push(
        self,
        seq: int,
        pulled_versions: Sequence[int] | None,
        tensors: Sequence[Tensor],
        *,
        num_samples: int = 1,
        local_steps: int = 1,
    ) -> PushAck:
        """Send push ``seq`` (strictly increasing per worker; a repeat is acknowledged, not applied)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport(ABC):
    @abstractmethod
    def serve(
        self, server: ParameterServer, host: str = "127.0.0.1", port: int = 0, *, secret: bytes | None = None
    ) -> Endpoint:
        """Start serving ``server``; ``secret=None`` draws a fresh one (``endpoint.info.secret``)."""

    @abstractmethod
    def connect(
        self,
        address: str,
        secret: bytes,
        worker_id: int,
        *,
        timeout: float = 30.0,
        tls_cert: str | None = None,
    ) -> Client:
        """Connect and authenticate as ``worker_id``; raises ConnectFailed / AuthenticationError."""
