"""The driver's quorum endpoint of a per-step fault-tolerant job: the workers' authenticated
connections, their heartbeats, and the heal state relayed from a live peer to a joiner.

It speaks the parameter server's wire format (``sparkdp.ps.transport.channel``): the same mutual
HMAC handshake on the job's secret, a MAC and a sequence number on every frame, JSON and raw
tensor bytes, never a pickle. One thread per connection reads its frames with a heartbeat
deadline: a closed connection, a frame that fails its checks, or ``heartbeat_timeout_s`` without
a frame loses the worker (:meth:`Quorum.lose`). The decisions the quorum takes are sent from
the thread whose message completed them; a joiner's decision waits for its healer's ``HEAL``
frame and carries the healer's state (sparkdp state bytes) as its payload.

A connection may send tensors only while its quorum decision asks it to heal a joiner (every
other frame is JSON of at most 64 KiB), so an authenticated peer cannot make the driver hold more
than one model's state per heal.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import AuthenticationError, ProtocolError
from ..ps import codec
from ..ps.auth import NONCE_BYTES, SessionKeys, client_proof, new_secret, server_proof, verify
from ..ps.transport.base import ConnectInfo
from ..ps.transport.channel import Channel, PeerClosed
from ..ps.transport.tcp_options import format_address
from .quorum import Arrival, Decision, Quorum

log = logging.getLogger(__name__)
Op = codec.Op

#: what a worker may send when it heals no one: JSON only
JSON_ONLY = codec.Limits(max_json_bytes=1 << 16, max_payload_bytes=0)
HANDSHAKE_TIMEOUT_S = 10.0
FRAME_TIMEOUT_S = 60.0
#: connections in their handshake at most; more are closed on arrival (a worker retries)
MAX_HANDSHAKES = 128


class QuorumServer:
    """The quorum's endpoint on ``host`` (the driver's address; never every interface).

    ``on_record(record)`` hears of every leave and join as the quorum records it (one console
    line each, by the job kind). ``max_heal_bytes``: the largest state a healer may send."""

    def __init__(
        self,
        quorum: Quorum,
        host: str,
        *,
        heartbeat_timeout_s: float = 5.0,
        max_heal_bytes: int = 2 * 2**30,
        on_record: Callable[[dict[str, Any]], None] = lambda record: None,
    ) -> None:
        self.quorum, self.heartbeat_timeout_s, self.on_record = quorum, heartbeat_timeout_s, on_record
        self._heal_limits = codec.Limits(max_json_bytes=1 << 16, max_payload_bytes=max_heal_bytes)
        self._secret = new_secret()
        self._lock = threading.Lock()  # the quorum, the connections and the pending heals
        self._conns: dict[int, Channel] = {}
        self._send_locks: dict[int, threading.Lock] = {}
        #: joiner -> (its decision, when it was taken), until its healer's state arrives
        self._heals: dict[int, tuple[Decision, float]] = {}
        self._seen_records = 0
        #: connections ended by an error no check foresaw (a bug; the fuzzers count them)
        self.unexpected = 0
        self._handshaking = 0  # connections in their handshake
        self._stop = threading.Event()
        family, _, _, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(64)
        bound = self._listener.getsockname()
        self.info = ConnectInfo(format_address(bound[0], bound[1]), self._secret)
        self._threads: list[threading.Thread] = []
        self.changed = threading.Condition(self._lock)  # notified at every decision and loss
        self._start(self._accept_loop, "sparkdp-quorum-accept")

    def __enter__(self) -> QuorumServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(timeout=5)  # the accept loop: no connection is added after this
        self._listener.close()
        with self._lock:
            channels = list(self._conns.values())
        for chan in channels:
            chan.sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.2)  # closing a listener does not wake a blocked accept()
        while not self._stop.is_set():
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                full = self._handshaking >= MAX_HANDSHAKES
                self._handshaking += not full
            if full:  # a flood of connections holds no more threads than this
                sock.close()
                continue
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            self._start(self._serve, f"sparkdp-quorum-{peer}", sock, peer)

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        worker, cause = None, "its connection closed"
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            chan = Channel(sock, "server", JSON_ONLY, FRAME_TIMEOUT_S)
            try:
                worker = self._handshake(chan)
            finally:
                with self._lock:
                    self._handshaking -= 1
            self._register(worker, chan)
            while not self._stop.is_set():
                with self._lock:
                    chan.limits = self._heal_limits if self._heals_pending_from(worker) else JSON_ONLY
                msg = chan.recv(self.heartbeat_timeout_s)
                if msg.op is Op.BYE:
                    cause = "" if self.quorum.done else "it left before the job ended"
                    return
                self._dispatch(worker, msg)
        except PeerClosed:
            pass
        except TimeoutError:
            cause = f"no heartbeat for {self.heartbeat_timeout_s:g} s"
        except (ProtocolError, OSError, ValueError) as exc:
            cause = f"{type(exc).__name__}: {exc}"
            if not self._stop.is_set():
                log.warning(
                    "sparkdp: closing the quorum connection from %s (worker %s): %s", peer, worker, exc
                )
        except Exception as exc:  # a bug reached through a peer's input ends that connection only
            cause = f"unexpected {type(exc).__name__}: {str(exc)[:300]}"
            self.unexpected += 1
            log.warning(
                "sparkdp: closing the quorum connection from %s (worker %s) after an %s", peer, worker, cause
            )
        finally:
            sock.close()
            if worker is not None:
                self._lost(worker, sock, cause)

    def _handshake(self, chan: Channel) -> int:
        """The parameter server's handshake (``sparkdp.ps.auth``): the worker's number, authenticated."""
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        chan.send(Op.HELLO, {"nonce": server_nonce.hex()})
        msg = chan.recv(HANDSHAKE_TIMEOUT_S, deadline=time.monotonic() + HANDSHAKE_TIMEOUT_S)
        try:
            worker, client_nonce = msg.meta["worker"], bytes.fromhex(msg.meta["nonce"])
            proof = bytes.fromhex(msg.meta["proof"])
            ok = msg.op is Op.AUTH and type(worker) is int and 0 <= worker < 2**63
            ok = ok and len(client_nonce) == NONCE_BYTES
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ProtocolError(f"malformed quorum handshake message {msg.op.name}.")
        if not verify(client_proof(self._secret, server_nonce, client_nonce, worker), proof):
            raise AuthenticationError(
                f"a client claiming worker {worker} failed authentication (wrong secret)."
            )
        if worker >= self.quorum.workers:
            raise ProtocolError(
                f"worker {worker} is not one of this job's 0..{self.quorum.workers - 1}; refused."
            )
        chan.set_keys(SessionKeys.derive(self._secret, server_nonce, client_nonce, worker), False)
        chan.send(
            Op.AUTH_OK,
            {
                "proof": server_proof(self._secret, server_nonce, client_nonce, worker).hex(),
                "mac_payload": False,
            },
        )
        return worker

    def _register(self, worker: int, chan: Channel) -> None:
        """``worker``'s connection; an older one of the same worker (a task Spark retried) is closed."""
        with self._lock:
            old = self._conns.get(worker)
            self._conns[worker] = chan
            self._send_locks[worker] = threading.Lock()
        if old is not None:
            old.sock.close()

    def _heals_pending_from(self, worker: int) -> bool:
        return any(decision.heal_from == worker for decision, _ in self._heals.values())

    def _dispatch(self, worker: int, msg: codec.Message) -> None:
        if msg.op is Op.HEARTBEAT:
            return
        if msg.op is Op.QUORUM:
            arrival = Arrival.from_json(msg.meta)
            with self._lock:
                decisions = self.quorum.arrive(worker, arrival)
            self._deliver(decisions)
        elif msg.op is Op.HEAL:
            self._relay_heal(worker, msg)
        else:
            raise ProtocolError(f"unexpected {msg.op.name} from worker {worker} on the quorum endpoint.")

    def _relay_heal(self, healer: int, msg: codec.Message) -> None:
        """The healer's state, as the payload of each joiner's decision."""
        if len(msg.tensors) != 1 or msg.tensors[0].dtype != torch.uint8 or msg.tensors[0].dim() != 1:
            raise ProtocolError("a HEAL frame carries one flat uint8 tensor: the state's bytes.")
        with self._lock:  # (a malformed heal above leaves the joiners to the healer's loss)
            joiners = [j for j, (d, _) in self._heals.items() if d.heal_from == healer]
            waiting = [(j, *self._heals.pop(j)) for j in joiners]
        state = msg.tensors[0]
        for joiner, decision, since in waiting:
            self._send(joiner, decision, [state])
            with self._lock:
                self.quorum.healed(joiner, time.perf_counter() - since, state.numel())
                self._announce()

    def _deliver(self, decisions: dict[int, Decision]) -> None:
        """Send each decision; a joiner's waits for its healer's state."""
        now = time.perf_counter()
        with self._lock:  # every heal pending before any decision goes out: the healer answers at once
            for worker, decision in decisions.items():
                if decision.heal_from is not None:
                    self._heals[worker] = (decision, now)
                    healer = self._conns.get(decision.heal_from)
                    if healer is not None:  # its thread may wait in recv already, under JSON_ONLY
                        healer.limits = self._heal_limits
        for worker, decision in decisions.items():
            if decision.heal_from is None:
                self._send(worker, decision)
        with self._lock:
            self._announce()
            self.changed.notify_all()

    def _send(self, worker: int, decision: Decision, tensors: list[torch.Tensor] | None = None) -> None:
        with self._lock:
            chan, lock = self._conns.get(worker), self._send_locks.get(worker)
        if chan is None or lock is None:
            return  # gone since: its loss is the quorum's to handle
        try:
            with lock:
                chan.send(Op.QUORUM_REPLY, decision.to_json(), tensors or ())
        except OSError:
            chan.sock.close()  # its thread sees the closed socket and loses the worker

    def _lost(self, worker: int, sock: socket.socket, cause: str) -> None:
        with self._lock:
            chan = self._conns.get(worker)
            if chan is None or chan.sock is not sock:
                return  # a newer connection of this worker replaced this one
            del self._conns[worker]
            orphans = [j for j, (d, _) in self._heals.items() if d.heal_from == worker]
            decisions = self.quorum.lose(worker, cause) if cause else {}
            for joiner in orphans:  # its healer is gone: the joiner starts over (its task fails)
                self._heals.pop(joiner)
                self.quorum.healed(joiner, None, 0)
                decisions.update(self.quorum.lose(joiner, f"worker {worker}, its healer, was lost"))
        for joiner in orphans:
            self._close(joiner)
        self._deliver({w: d for w, d in decisions.items() if w not in orphans})

    def _close(self, worker: int) -> None:
        with self._lock:
            chan = self._conns.get(worker)
        if chan is not None:
            chan.sock.close()

    def _announce(self) -> None:
        """Hand each new leave or join record to ``on_record`` (under the lock, in order)."""
        records = self.quorum.records
        while self._seen_records < len(records):
            record = records[self._seen_records]
            if record["kind"] == "leave" or "heal_s" in record:  # (None: its healer was lost)
                self.on_record(record)
                self._seen_records += 1
            else:
                return  # a join is announced once its heal is done

    def wait(self, finished: Callable[[], bool], timeout_s: float) -> None:
        """Block until ``finished()`` (checked at every quorum change) or ``timeout_s`` passed."""
        with self._lock:
            self.changed.wait_for(finished, timeout_s)


__all__ = ["QuorumServer"]
