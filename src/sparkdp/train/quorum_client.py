"""A worker's connection to the driver's quorum (``driver.quorum_server``) in a per-step
fault-tolerant job: the authenticated handshake of ``sparkdp.ps.auth``, a heartbeat thread, and
one request per step boundary.

Only the training thread reads from the connection (the replies to its own requests); the
heartbeat thread only sends, under the same lock as the training thread's sends, so frames never
interleave on the wire.
"""

from __future__ import annotations

import random
import secrets
import socket
import threading
import time

import torch

from ..errors import AuthenticationError, ProtocolError
from ..ps import codec
from ..ps.auth import NONCE_BYTES, SessionKeys, client_proof, server_proof, verify
from ..ps.transport.base import ConnectInfo
from ..ps.transport.channel import Channel, PeerClosed
from ..ps.transport.tcp_options import parse_address
from .quorum_messages import Decision

Op = codec.Op
#: the largest state a worker accepts from a healer (as the driver's default)
MAX_HEAL_BYTES = 2 * 2**30
#: how long a worker keeps trying to connect when the endpoint closes it on arrival
CONNECT_TIMEOUT_S = 30.0


class QuorumClient:
    """Worker ``worker``'s authenticated connection to the quorum at ``info``.

    ``wait_s``: how long a boundary may wait for the quorum's decision (the other workers finish
    their step first; a joiner waits for the next boundary)."""

    def __init__(self, info: ConnectInfo, worker: int, *, wait_s: float, heartbeat_s: float = 1.0) -> None:
        self.worker, self.wait_s = worker, wait_s
        self._lock = threading.Lock()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                self._connect(info)
                break
            except (ConnectionRefusedError, ConnectionResetError, PeerClosed):
                if time.monotonic() > deadline:  # (the endpoint closes connections beyond its limit)
                    raise
                time.sleep(random.uniform(0.05, 0.5))
        self._stop = threading.Event()
        self._beat = threading.Thread(
            target=self._heartbeat, args=(heartbeat_s,), name="sparkdp-quorum-heartbeat", daemon=True
        )
        self._beat.start()

    def _connect(self, info: ConnectInfo) -> None:
        host, port = parse_address(info.address)
        sock = socket.create_connection((host, port), timeout=30.0)
        limits = codec.Limits(max_json_bytes=1 << 16, max_payload_bytes=MAX_HEAL_BYTES)
        self._chan = Channel(sock, "client", limits, frame_timeout=60.0)
        try:
            self._handshake(info.secret)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, secret: bytes) -> None:
        chan = self._chan
        hello = chan.recv(30.0)
        try:
            server_nonce = bytes.fromhex(hello.meta.get("nonce", "")) if hello.op is Op.HELLO else b""
        except (TypeError, ValueError):
            server_nonce = b""
        if len(server_nonce) != NONCE_BYTES:
            raise ProtocolError("the quorum endpoint did not greet like a sparkdp driver.")
        nonce = secrets.token_bytes(NONCE_BYTES)
        proof = client_proof(secret, server_nonce, nonce, self.worker)
        chan.send(Op.AUTH, {"worker": self.worker, "nonce": nonce.hex(), "proof": proof.hex()})
        chan.set_keys(SessionKeys.derive(secret, server_nonce, nonce, self.worker), False)
        try:
            reply = chan.recv(30.0)
            ok = reply.op is Op.AUTH_OK and verify(
                server_proof(secret, server_nonce, nonce, self.worker),
                bytes.fromhex(reply.meta.get("proof", "")),
            )
        except (ProtocolError, OSError, TypeError, ValueError) as exc:
            raise AuthenticationError(f"the driver's quorum refused worker {self.worker}: {exc}") from None
        if not ok:
            raise AuthenticationError("the quorum endpoint could not prove it holds the job secret.")

    def _heartbeat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                with self._lock:
                    self._chan.send(Op.HEARTBEAT, {})
            except OSError:
                return  # the training thread sees the broken connection at its next request

    def boundary(self, step: int, ok: bool | None) -> tuple[Decision, bytes | None]:
        """Arrive at a step boundary with ``step`` committed steps (``driver.quorum.JOINING`` for
        a replacement) and how the last step's collective went; the quorum's decision and, for a
        joiner, its healer's state bytes."""
        with self._lock:
            self._chan.send(Op.QUORUM, {"step": step, "ok": ok})
        reply = self._chan.recv(self.wait_s)
        if reply.op is not Op.QUORUM_REPLY:
            raise ProtocolError(f"expected a quorum reply from the driver, got {reply.op.name}.")
        decision = Decision.from_json(reply.meta)
        if not reply.tensors:
            return decision, None
        [state] = reply.tensors
        if state.dtype != torch.uint8 or state.dim() != 1:
            raise ProtocolError("a healer's state must arrive as one flat uint8 tensor.")
        return decision, state.numpy().tobytes()

    def heal(self, joiners: tuple[int, ...], state: bytes) -> None:
        """Send this worker's state for ``joiners`` (the driver relays it to each)."""
        payload = torch.frombuffer(bytearray(state), dtype=torch.uint8)
        with self._lock:
            self._chan.send(Op.HEAL, {"to": list(joiners)}, [payload])

    def close(self) -> None:
        """Leave politely (the driver counts a worker that only disconnects as lost)."""
        self._stop.set()
        try:
            with self._lock:
                self._chan.send(Op.BYE, {})
        except OSError:
            pass
        self._chan.sock.close()
        self._beat.join(timeout=2)

    def abandon(self) -> None:
        """Close without a goodbye (after an error: the driver then drops this worker)."""
        self._stop.set()
        self._chan.sock.close()
        self._beat.join(timeout=2)


__all__ = ["MAX_HEAL_BYTES", "QuorumClient"]
