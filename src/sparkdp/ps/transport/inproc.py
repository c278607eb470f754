"""In-process transport: direct calls to the ParameterServer (the null object of G6).

For tests and world_size == 1 the async strategy runs the same code as over TCP.  With
``use_codec=True`` every request and reply is encoded to bytes and decoded again, so the
codec is exercised without sockets.  The secret is still checked.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from torch import Tensor

from sparkdp.errors import AuthenticationError
from sparkdp.ps import codec
from sparkdp.ps.auth import check_secret, new_secret, verify
from sparkdp.ps.server import ParameterServer, Pulled, PushAck, check_worker
from sparkdp.ps.transport.base import Client, ConnectFailed, ConnectInfo, Endpoint, Transport


class InProcEndpoint(Endpoint):
    def __init__(
        self, transport: InProcTransport, server: ParameterServer, address: str, secret: bytes
    ) -> None:
        self.server = server
        self.info = ConnectInfo(address, secret)
        self._transport = transport
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self._transport._forget(self.address)


class InProcClient(Client):
    def __init__(self, endpoint: InProcEndpoint, worker_id: int, use_codec: bool) -> None:
        self._endpoint = endpoint
        self._server = endpoint.server
        self.worker_id = worker_id
        self.num_shards = self._server.num_shards
        self.last_seq = self._server.last_seq(worker_id)
        self._use_codec = use_codec
        self._seq = itertools.count(1)

    def _check_open(self) -> None:
        if self._endpoint.closed:
            raise ConnectFailed(f"in-process parameter server {self._endpoint.address} was closed.")

    def _through_codec(self, op: codec.Op, meta: dict, tensors: Sequence[Tensor]) -> codec.Message:
        return codec.decode_from_bytes(codec.encode_to_bytes(op, next(self._seq), meta, tensors))

    def pull(self, *, out: Sequence[Tensor] | None = None, observe: bool = False) -> Pulled:
        self._check_open()
        if not self._use_codec:
            return self._server.pull(self.worker_id, out=out, observe=observe)
        msg = self._through_codec(codec.Op.PULL, {"observe": True} if observe else {}, ())
        versions, tensors = self._server.pull(self.worker_id, observe=msg.meta.get("observe") is True)
        reply = self._through_codec(codec.Op.PULL_REPLY, {"versions": versions}, tensors)
        if out is not None:
            for dst, src in zip(out, reply.tensors, strict=True):
                dst.copy_(src)
            return Pulled(reply.meta["versions"], list(out))
        return Pulled(reply.meta["versions"], reply.tensors)

    def push(self, seq, pulled_versions, tensors, *, num_samples=1, local_steps=1) -> PushAck:
        self._check_open()
        if self._use_codec:
            meta = {"seq": seq, "pulled": None if pulled_versions is None else list(pulled_versions)}
            msg = self._through_codec(codec.Op.PUSH, meta, tensors)
            seq, pulled_versions, tensors = msg.meta["seq"], msg.meta["pulled"], msg.tensors
        return self._server.push(self.worker_id, seq, pulled_versions, tensors, num_samples, local_steps)

    def close(self) -> None:
        return None


class InProcTransport(Transport):
    """Endpoints live in this transport instance (no module-level registry to reset)."""

    def __init__(self, *, use_codec: bool = False) -> None:
        self.use_codec = use_codec
        self._endpoints: dict[str, InProcEndpoint] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def serve(self, server, host="127.0.0.1", port=0, *, secret=None) -> InProcEndpoint:
        secret = new_secret() if secret is None else check_secret(secret)
        with self._lock:
            address = f"inproc://{next(self._ids)}"
            endpoint = self._endpoints[address] = InProcEndpoint(self, server, address, secret)
        return endpoint

    def connect(self, address, secret, worker_id, *, timeout=30.0, tls_cert=None) -> InProcClient:
        with self._lock:
            endpoint = self._endpoints.get(address)
        if endpoint is None:
            raise ConnectFailed(
                f"no in-process parameter server at {address!r} (known: {sorted(self._endpoints)}); "
                "connect with the same InProcTransport instance that served it."
            )
        if not verify(endpoint.info.secret, check_secret(secret)):
            raise AuthenticationError(f"worker {worker_id} presented a wrong secret to {address}.")
        return InProcClient(endpoint, check_worker(worker_id), self.use_codec)

    def _forget(self, address: str) -> None:
        with self._lock:
            self._endpoints.pop(address, None)
