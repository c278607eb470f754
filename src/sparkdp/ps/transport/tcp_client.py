"""The TCP client side: a worker's authenticated connection to the parameter server."""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence

from torch import Tensor

from sparkdp.errors import AuthenticationError, ProtocolError
from sparkdp.ps import codec
from sparkdp.ps.auth import NONCE_BYTES, SessionKeys, check_secret, client_proof, server_proof, verify
from sparkdp.ps.server import Pulled, PushAck, check_worker
from sparkdp.ps.sharding import ShardPlan
from sparkdp.ps.transport.base import Client, ConnectFailed
from sparkdp.ps.transport.channel import Channel, PeerClosed
from sparkdp.ps.transport.tcp_options import ERROR_KINDS, TcpOptions, parse_address, tune_socket

Op = codec.Op
log = logging.getLogger(__name__)
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 2.0


class _ClosedBeforeHello(ProtocolError):
    """The server closed the connection on arrival (it does so at its handshake limits)."""


#: Failures of a connect or handshake worth another attempt within the deadline: nobody listens
#: yet, or the server refused / reset the connection before authenticating.  Never an
#: AuthenticationError (a wrong secret stays wrong), a timeout (the deadline is spent) or a
#: certificate that is not the pinned one.
_RETRYABLE = (
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    _ClosedBeforeHello,
)


class TcpClient(Client):
    """A worker's authenticated connection; see :meth:`TcpTransport.connect`."""

    def __init__(
        self,
        address: str,
        secret: bytes,
        worker_id: int,
        timeout: float,
        tls_cert: str | None,
        opts: TcpOptions,
        initial: Sequence[Tensor] | None = None,
    ) -> None:
        self.address, self.worker_id, self._opts = address, check_worker(worker_id), opts
        self._lock = threading.Lock()
        self._broken: str | None = None
        host, port = parse_address(address)
        secret = check_secret(secret)
        deadline = time.monotonic() + timeout
        for attempt in itertools.count(1):
            try:
                self._connect_once(host, port, secret, tls_cert, max(deadline - time.monotonic(), 0.001))
                break
            except _RETRYABLE as exc:
                # Exponential backoff with jitter: the server refuses connections while too many
                # handshakes are open (from our address or in all) and workers started together
                # must not come back in lockstep.
                delay = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                if time.monotonic() + delay >= deadline:
                    raise ConnectFailed(
                        f"worker {worker_id} cannot connect to the parameter server at {address} "
                        f"({attempt} attempts in {timeout:g}s, the last: {exc or type(exc).__name__}). "
                        "Is the driver still running, and can executors reach the driver's host (firewall, "
                        "spark.driver.host)? A server busy with many handshakes refuses connections for a "
                        "while: raise the connect timeout."
                    ) from exc
                log.debug("connect to %s failed (%s); retrying in %.2fs", address, exc, delay)
                time.sleep(delay)
        try:
            if initial is not None and self._awaits_centre:
                self._give_centre(initial)
            elif initial is not None and self.plan is not None:  # the centre exists: the model must match it
                self.plan.check(list(initial), f"worker {worker_id}'s model")
        except BaseException:
            self._chan.sock.close()
            raise

    def _connect_once(
        self, host: str, port: int, secret: bytes, tls_cert: str | None, timeout: float
    ) -> None:
        """One connect and handshake; raises what :data:`_RETRYABLE` lists when worth another try."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except _RETRYABLE:
            raise
        except OSError as exc:  # no such host, unreachable network, connect timed out
            raise ConnectFailed(
                f"worker {self.worker_id} cannot connect to the parameter server at {self.address}: {exc}. "
                "Is the driver still running, and can executors reach the driver's host (firewall, "
                "spark.driver.host)?"
            ) from exc
        try:
            tune_socket(sock, self._opts)
            if tls_cert is not None:
                from sparkdp.ps.transport.tls import make_client_context

                sock.settimeout(timeout)
                sock = make_client_context(tls_cert).wrap_socket(sock)
            self._chan = Channel(sock, "client", self._opts.limits, self._opts.frame_timeout)
            self._handshake(secret, timeout)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, secret: bytes, timeout: float) -> None:
        chan = self._chan
        try:
            hello = chan.recv(timeout)
            server_nonce = bytes.fromhex(hello.meta.get("nonce", "")) if hello.op is Op.HELLO else b""
        except PeerClosed:  # what a server at its handshake limit does: retried by the caller
            raise _ClosedBeforeHello(f"{self.address} closed the connection before the handshake.") from None
        except (ValueError, TypeError):  # nonce not hex / not a string
            server_nonce = b""
        if len(server_nonce) != NONCE_BYTES:
            raise ProtocolError(f"{self.address} did not greet like a sparkdp parameter server.")
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        proof = client_proof(secret, server_nonce, client_nonce, self.worker_id)
        chan.send(
            Op.AUTH,
            {
                "worker": self.worker_id,
                "nonce": client_nonce.hex(),
                "proof": proof.hex(),
                "mac_payload": self._opts.mac_payload,
            },
        )
        chan.set_keys(
            SessionKeys.derive(secret, server_nonce, client_nonce, self.worker_id), self._opts.mac_payload
        )
        try:
            reply = chan.recv(timeout)
        except PeerClosed:  # closed with no reply at all: a busy server gave the slot to a newer connection
            raise _ClosedBeforeHello(f"{self.address} closed the connection during the handshake.") from None
        except (ProtocolError, OSError) as exc:
            raise AuthenticationError(
                f"parameter server at {self.address} rejected worker {self.worker_id}'s handshake ({exc}): "
                "the job secret differs — connect with the secret of this job's endpoint.info."
            ) from None
        if reply.op is Op.ERROR:  # authenticated, but refused (e.g. a worker id outside the job)
            raise ERROR_KINDS.get(reply.meta.get("kind", ""), ProtocolError)(
                f"parameter server at {self.address}: {reply.meta.get('message')}"
            )
        ok = reply.op is Op.AUTH_OK and verify(
            server_proof(secret, server_nonce, client_nonce, self.worker_id),
            bytes.fromhex(reply.meta.get("proof", "")),
        )
        if not ok:
            raise AuthenticationError(f"{self.address} could not prove it holds the job secret.")
        if self._opts.mac_payload and reply.meta.get("mac_payload") is not True:
            raise AuthenticationError(f"{self.address} refused the payload MAC this client requires.")
        chan.mac_payload = reply.meta["mac_payload"] is True
        plan = reply.meta.get("plan")  # absent: a monitoring endpoint (reports only)
        self.plan = ShardPlan.from_json(plan) if plan is not None else None
        self.num_shards = self.plan.num_shards if self.plan is not None else 0
        self.last_seq = int(reply.meta.get("last_seq", -1))
        self._awaits_centre = reply.meta.get("awaits_centre") is True

    def _give_centre(self, initial: Sequence[Tensor]) -> None:
        """Offer this worker's model as the initial centre of a server started without one; the
        first offer wins, and every client gets the model description back (``sparkdp.run``)."""
        reply = self._request(Op.INIT, {}, [t.detach().cpu().contiguous() for t in initial], Op.INIT_REPLY)
        self.plan = ShardPlan.from_json(reply.meta["plan"])
        self.plan.check(list(initial), f"worker {self.worker_id}'s model")
        self.num_shards, self.last_seq = self.plan.num_shards, int(reply.meta.get("last_seq", -1))
        self._awaits_centre = False

    @contextlib.contextmanager
    def _usable(self) -> Iterator[Channel]:
        """The channel, under the lock, unless an earlier error broke it; an error while it is in
        use breaks it (the stream may be mid-frame) and closes the socket."""
        with self._lock:
            if self._broken:
                raise ProtocolError(
                    f"connection to {self.address} is unusable after an earlier error ({self._broken}); reconnect."
                )
            try:
                yield self._chan
            except (ProtocolError, OSError) as exc:
                self._broken = str(exc) or type(exc).__name__
                self._chan.sock.close()
                raise

    def _request(
        self, op: Op, meta: dict, tensors: Sequence[Tensor], reply_op: Op, into=None
    ) -> codec.Message:
        try:
            with self._usable() as chan:
                chan.send(op, meta, tensors)
                reply = chan.recv(self._opts.frame_timeout, into=into)
        except TimeoutError as exc:
            raise TimeoutError(
                f"no reply from the parameter server at {self.address} within "
                f"{self._opts.frame_timeout}s; raise TcpOptions.frame_timeout for slow links."
            ) from exc
        if reply.op is Op.ERROR:
            kind = ERROR_KINDS.get(reply.meta.get("kind", ""), ProtocolError)
            raise kind(f"parameter server: {reply.meta.get('message')}")
        if reply.op is not reply_op:
            raise ProtocolError(f"expected {reply_op.name} from {self.address}, got {reply.op.name}.")
        return reply

    def _need_plan(self) -> ShardPlan:
        if self.plan is None and self._awaits_centre:
            raise ProtocolError(
                f"the parameter server at {self.address} has no centre yet; connect with "
                "initial=<the model's tensors> to give it one."
            )
        if self.plan is None:
            raise ProtocolError(
                f"{self.address} is a monitoring endpoint; it holds no parameters to pull or push."
            )
        return self.plan

    def pull(self, *, out: Sequence[Tensor] | None = None, observe: bool = False) -> Pulled:
        plan = self._need_plan()
        if out is not None:
            plan.check(out, "pull(out=...)")
        meta = {"observe": True} if observe else {}
        reply = self._request(Op.PULL, meta, (), Op.PULL_REPLY, into=out)  # received straight into `out`
        plan.check(reply.tensors, f"pull reply from {self.address}")
        if out is None or all(a is b for a, b in zip(reply.tensors, out, strict=True)):
            return Pulled(reply.meta["versions"], reply.tensors)
        for dst, src in zip(
            out, reply.tensors, strict=True
        ):  # `out` not contiguous: the channel could not scatter
            dst.copy_(src)
        return Pulled(reply.meta["versions"], list(out))

    def push(self, seq, pulled_versions, tensors, *, num_samples=1, local_steps=1) -> PushAck:
        plan = self._need_plan()
        plan.check(tensors, f"push from worker {self.worker_id}")  # fail before sending 100s of MB
        meta = {"seq": seq, "pulled": None if pulled_versions is None else list(pulled_versions),
                "num_samples": num_samples, "local_steps": local_steps}  # fmt: skip
        reply = self._request(Op.PUSH, meta, tensors, Op.PUSH_REPLY)
        return PushAck(reply.meta["versions"], bool(reply.meta["applied"]))

    def report(self, record: dict) -> None:
        """Send one monitoring record (JSON values); no reply is awaited."""
        with self._usable() as chan:
            chan.send(Op.REPORT, record)

    def ask(self, record: dict) -> dict:
        """Send one monitoring record (JSON values) and return the endpoint's answer (JSON)."""
        return dict(self._request(Op.ASK, record, (), Op.ANSWER).meta)

    def close(self) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = "closed by the client"
                try:
                    self._chan.send(Op.BYE, {})
                except OSError:
                    pass  # the server may already be gone; closing anyway
            self._chan.sock.close()
