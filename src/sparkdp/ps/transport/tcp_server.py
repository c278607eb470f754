"""The TCP server side: accept thread, one thread per connection, handshake, dispatch."""

from __future__ import annotations

import errno
import logging
import secrets
import select
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from sparkdp.errors import AuthenticationError, ProtocolError
from sparkdp.ps import codec
from sparkdp.ps.auth import NONCE_BYTES, SessionKeys, client_proof, server_proof, verify
from sparkdp.ps.server import ParameterServer, PushRejected
from sparkdp.ps.transport.base import ConnectFailed, ConnectInfo, Endpoint
from sparkdp.ps.transport.channel import Channel, PeerClosed
from sparkdp.ps.transport.tcp_options import TcpOptions, format_address, source_prefix, tune_socket

log = logging.getLogger(__name__)
Op = codec.Op
#: seconds a connection keeps its push and pull buffers while no request comes (a worker
#: exchanging keeps them; 1,024 idle ones hold none)
KEEP_BUFFERS_S = 30.0
_WILDCARDS = {"", "0.0.0.0", "::"}


class TcpEndpoint(Endpoint):
    """The listening server; see :meth:`TcpTransport.serve`.

    ``server`` may be None for an endpoint that only takes monitoring records: ``reports``
    is then called with ``(worker, record)`` for every ``REPORT`` and ``ASK`` frame (on the
    connection's thread; what it returns for an ``ASK``, a dict, is sent back as the ``ANSWER``),
    and pulls and pushes are protocol errors.

    ``server`` None with ``initial``: a server whose centre comes from the workers (``sparkdp.run``,
    where the model is built inside the user's function): the first authenticated ``INIT``
    frame's tensors become the centre, ``initial(tensors)`` builds the server, and later
    ``INIT`` frames only get the model description back."""

    def __init__(
        self,
        server: ParameterServer | None,
        host: str,
        port: int,
        secret: bytes,
        opts: TcpOptions,
        reports: Callable[[int, dict[str, Any]], dict[str, Any] | None] | None = None,
        initial: Callable[[list[torch.Tensor]], ParameterServer] | None = None,
        on_connect: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self.server, self._secret, self._opts, self._reports = server, secret, opts, reports
        self._initial, self._init_lock = initial, threading.Lock()
        #: told (worker, how many times it has connected, its last applied push seq or -1) after
        #: every handshake: a second connection of a worker is a retried task
        self._on_connect, self._connections = on_connect, Counter[int]()
        self._tls_ctx, cert = None, None
        if opts.tls:
            from sparkdp.ps.transport.tls import make_server_context

            self._tls_ctx, cert = make_server_context()
        if host in _WILDCARDS:
            log.warning(
                "parameter server binds all interfaces (%r) as asked; prefer the driver's address", host
            )
        family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            if port == 0 or exc.errno != errno.EADDRINUSE:
                self._listener.close()
                raise ConnectFailed(
                    f"cannot bind the parameter server to {format_address(host, port)}: {exc}"
                ) from exc
            log.warning("port %d on %s is taken; the parameter server uses a free port instead", port, host)
            self._listener.bind((host, 0))
        self._listener.listen(128)
        bound_host, bound_port = self._listener.getsockname()[:2]
        self.info = ConnectInfo(format_address(bound_host, bound_port), secret, cert)
        self.rejected_connections = 0  # protocol / auth failures, for tests and monitoring
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # thread -> its socket (None once it closed it).  A thread stays here until it has
        # *ended*, not just closed its socket: freeing its buffers takes a while, and a thread
        # still inside torch when the interpreter exits aborts the process.
        self._conns: dict[threading.Thread, socket.socket | None] = {}
        # connections still in their handshake, oldest first, with their source's network prefix
        # (bounded, see TcpOptions), and how many each prefix has
        self._pending: dict[threading.Thread, str] = {}
        self._pending_from: Counter[str] = Counter()
        self._evicted: set[threading.Thread] = set()  # closed by the accept loop for a newer handshake
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"sparkdp-ps-accept-{bound_port}", daemon=True
        )
        self._accept_thread.start()
        log.info(
            "%s listening on %s (tls=%s, mac_payload=%s)",
            "parameter server" if server is not None else "monitoring endpoint",
            self.address,
            opts.tls,
            opts.mac_payload,
        )

    def threads(self) -> list[threading.Thread]:
        with self._lock:
            return [self._accept_thread, *self._conns]

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:  # listener shut down by close(), or a transient accept error
                if self._stop.is_set():
                    return
                log.warning("accept() failed on %s; continuing", self.address, exc_info=True)
                continue
            thread = threading.Thread(
                target=self._serve_conn, args=(sock, peer), name=f"sparkdp-ps-conn-{peer[1]}", daemon=True
            )
            prefix = source_prefix(peer[0])
            victim = None
            with self._lock:
                if self._stop.is_set():
                    sock.close()
                    return
                for done in [t for t in self._conns if not t.is_alive()]:
                    del self._conns[done]
                    self._evicted.discard(done)
                busy = sum(s is not None for s in self._conns.values())
                pending = len(self._pending)
                full = busy >= self._opts.max_connections + self._opts.max_unauthenticated
                if full:
                    self.rejected_connections += 1
                else:
                    # At a limit, the newcomer takes the slot of the oldest handshake of its own network
                    # prefix, or (all slots taken) of the prefix holding the most: the slot of a peer that
                    # sits idle goes to the next arrival, while an honest client needs its slot only for
                    # the milliseconds its handshake takes, so it gets in however fast a flood reopens.
                    # Refusing newcomers instead would leave the slots to whoever reconnects fastest.
                    # Networks other than the flooder's are never touched (per-prefix counting).
                    if self._pending_from[prefix] >= self._opts.max_unauthenticated_per_source:
                        victim = self._oldest_pending(prefix)
                    elif pending >= self._opts.max_unauthenticated:
                        victim = self._oldest_pending(
                            max(self._pending_from, key=self._pending_from.__getitem__)
                        )
                    if victim is not None:
                        self._handshake_over(victim)
                        self._evicted.add(victim)
                        self.rejected_connections += 1
                    self._pending[thread] = prefix
                    self._pending_from[prefix] += 1
                    self._conns[thread] = sock
                victim_sock = self._conns.get(victim) if victim is not None else None
            if full:  # closed at once, without a thread: the cost of a refused peer is one accept()
                log.warning("refusing a connection from %s: %d connections open", peer, busy)
                sock.close()
                continue
            if victim_sock is not None:
                log.debug("closing the oldest handshake of %s for a connection from %s", prefix, peer)
                try:
                    victim_sock.shutdown(socket.SHUT_RDWR)  # its thread wakes and ends
                except OSError:
                    pass  # it just closed on its own
            thread.start()

    def _oldest_pending(self, prefix: str) -> threading.Thread:
        return next(t for t, p in self._pending.items() if p == prefix)  # dicts keep arrival order

    def _handshake_over(self, thread: threading.Thread) -> bool:
        """Give back ``thread``'s unauthenticated slot (with ``self._lock`` held); False if it had
        none (evicted, or already given back)."""
        prefix = self._pending.pop(thread, None)
        if prefix is None:
            return False
        self._pending_from[prefix] -= 1
        if not self._pending_from[prefix]:
            del self._pending_from[prefix]  # a Counter of every prefix ever seen would only grow
        return True

    def _rejected(self, thread: threading.Thread) -> bool:
        """Count ``thread``'s connection as rejected once (with ``self._lock`` held); True if an
        eviction already counted it. Its handshake slot goes back here, under the same lock: a
        connection that failed but still held its slot could otherwise be evicted, and counted,
        a second time before its ``finally`` gives the slot back."""
        evicted = thread in self._evicted
        self._handshake_over(thread)
        self.rejected_connections += not evicted
        return evicted

    def _serve_conn(self, sock: socket.socket, peer: tuple) -> None:
        worker = None
        try:
            tune_socket(sock, self._opts)
            sock.settimeout(self._opts.handshake_timeout)
            if self._tls_ctx is not None:
                sock = self._tls_ctx.wrap_socket(sock, server_side=True)
                with self._lock:
                    self._conns[threading.current_thread()] = sock
            chan = Channel(sock, "server", self._opts.limits, self._opts.frame_timeout)
            worker = self._handshake(chan)
            out = None  # reusable pull buffers: the reply is sent before the next request arrives
            while not self._stop.is_set():
                chan.limits = self._frame_limits()
                idle = self._opts.idle_timeout
                if (out is not None or chan.holds_buffer()) and not _readable(
                    chan.sock, min(KEEP_BUFFERS_S, idle)
                ):
                    # a connection that goes quiet keeps no model-sized buffers while it waits
                    out = None
                    chan.release_buffer()
                    idle -= min(KEEP_BUFFERS_S, idle)
                msg = chan.recv(idle, reuse_buffer=True)
                if msg.op is Op.BYE:
                    return
                if msg.op is Op.REPORT and self._reports is not None:
                    self._reports(worker, msg.meta)
                elif msg.op is Op.ASK and self._reports is not None:
                    answer = self._reports(worker, msg.meta)
                    chan.send(Op.ANSWER, answer if isinstance(answer, dict) else {})
                elif msg.op is Op.INIT and self._initial is not None:
                    self._handle_init(chan, worker, msg)
                    chan.release_buffer()  # the centre's bytes were copied; pushes get a buffer of their own size
                elif self.server is None:
                    raise ProtocolError(f"{msg.op.name} sent to an endpoint without a parameter server.")
                elif msg.op is Op.PULL:
                    if out is None:
                        out = [torch.empty(s.shape, dtype=s.dtype) for s in self.server.plan.params]
                    versions, tensors = self.server.pull(
                        worker, out=out, observe=msg.meta.get("observe") is True
                    )
                    chan.send(Op.PULL_REPLY, {"versions": versions}, tensors)
                elif msg.op is Op.PUSH:
                    self._handle_push(chan, worker, msg)
                else:
                    raise ProtocolError(f"unexpected op {msg.op.name} from worker {worker}.")
        except PeerClosed:
            log.debug("worker %s (%s) disconnected", worker, peer)
        except (ProtocolError, OSError) as exc:  # includes timeouts, TLS errors, auth failures
            with self._lock:
                evicted = self._rejected(threading.current_thread())
            if not self._stop.is_set() and not evicted:
                log.warning("closing connection from %s (worker %s): %s", peer, worker, exc)
        except Exception as exc:
            # Anything else is a bug reached through this peer's input; it must end this
            # connection only, and as a counted rejection, not as a dead thread's traceback on
            # stderr (one per connection an attacker opens).  One warning line; the traceback
            # goes to debug for whoever hunts the bug.
            with self._lock:
                self._rejected(threading.current_thread())
            if not self._stop.is_set():
                log.warning(
                    "closing connection from %s (worker %s) after an unexpected %s: %s",
                    peer,
                    worker,
                    type(exc).__name__,
                    str(exc)[:300],
                )
                log.debug("unexpected error on the connection from %s", peer, exc_info=True)
        finally:
            sock.close()
            with self._lock:
                self._conns[threading.current_thread()] = None
                self._handshake_over(threading.current_thread())  # if it never finished its handshake

    def _frame_limits(self) -> codec.Limits:
        """What an authenticated peer may send: a push of this server's model at most (its bytes
        plus each tensor's alignment padding), nothing for a monitoring endpoint, and the transport's
        limits only while the centre is still to come (its first ``INIT``)."""
        opts = self._opts.limits
        if self.server is not None:
            return codec.Limits(
                opts.max_json_bytes,
                min(opts.max_payload_bytes, codec.payload_bytes([p.nbytes for p in self.server.plan.params])),
            )
        if self._initial is not None:
            return opts
        return codec.Limits(opts.max_json_bytes, 0)

    def _handshake(self, chan: Channel) -> int:
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        chan.send(Op.HELLO, {"nonce": server_nonce.hex()})
        timeout = self._opts.handshake_timeout
        msg = chan.recv(timeout, deadline=time.monotonic() + timeout)
        try:
            worker, client_nonce, proof = (
                msg.meta["worker"],
                bytes.fromhex(msg.meta["nonce"]),
                bytes.fromhex(msg.meta["proof"]),
            )
            ok = (
                msg.op is Op.AUTH
                and type(worker) is int
                and 0 <= worker < 2**63
                and len(client_nonce) == NONCE_BYTES
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ProtocolError(f"malformed handshake message {msg.op.name}.")
        if not verify(client_proof(self._secret, server_nonce, client_nonce, worker), proof):
            chan.send(Op.ERROR, {"kind": "AuthenticationError", "message": "wrong job secret"})
            raise AuthenticationError(
                f"client claiming worker {worker} failed authentication (wrong secret)."
            )
        mac_payload = self._opts.mac_payload or msg.meta.get("mac_payload") is True
        chan.set_keys(SessionKeys.derive(self._secret, server_nonce, client_nonce, worker), mac_payload)
        if self.server is not None and not self.server.accepts(worker):
            # the peer holds the secret: tell it why, over the authenticated channel
            chan.send(
                Op.ERROR,
                {
                    "kind": "ValueError",
                    "message": f"worker id {worker} is not one of this job's "
                    f"(0..{(self.server.worker_ids or 0) - 1})",
                },
            )
            raise ProtocolError(f"authenticated client claimed worker id {worker}, outside the job; refused.")
        with self._lock:  # from here on no newer connection may take this one's slot
            if not self._handshake_over(threading.current_thread()):
                raise ProtocolError(f"worker {worker}'s handshake was closed for a newer connection.")
        welcome = {
            "proof": server_proof(self._secret, server_nonce, client_nonce, worker).hex(),
            "mac_payload": mac_payload,
        }
        last_seq = -1
        if self.server is not None:
            last_seq = self.server.last_seq(worker)
            welcome.update(plan=self.server.plan.to_json(), last_seq=last_seq)
        elif self._initial is not None:
            welcome.update(awaits_centre=True)
        if self._on_connect is not None:  # before the welcome: a worker's connections are heard in order
            with self._init_lock:
                self._connections[worker] += 1
                times = self._connections[worker]
            self._on_connect(worker, times, last_seq)
        chan.send(Op.AUTH_OK, welcome)
        return worker

    def _handle_init(self, chan: Channel, worker: int, msg: codec.Message) -> None:
        initial = self._initial
        assert initial is not None  # INIT is dispatched here only to an endpoint with an initial factory
        with self._init_lock:  # first one wins; the others learn the plan it made
            server = self.server
            first = server is None
            if server is None:
                try:
                    server = self.server = initial([t.clone() for t in msg.tensors])
                except (ValueError, TypeError) as exc:  # e.g. no tensors: the client's fault
                    chan.send(Op.ERROR, {"kind": "ValueError", "message": f"initial centre refused: {exc}"})
                    return
                log.info(
                    "worker %d gave the parameter server its initial centre (%d tensors)",
                    worker,
                    len(msg.tensors),
                )
        chan.send(
            Op.INIT_REPLY,
            {"plan": server.plan.to_json(), "last_seq": server.last_seq(worker), "first": first},
        )

    def _handle_push(self, chan: Channel, worker: int, msg: codec.Message) -> None:
        m = msg.meta
        server = self.server
        assert server is not None  # the dispatcher refuses PUSH to an endpoint without a server
        seq: Any = m.get("seq")  # untrusted, like the other fields: push() validates them
        try:
            ack = server.push(
                worker,
                seq,
                m.get("pulled"),
                msg.tensors,
                m.get("num_samples", 1),
                m.get("local_steps", 1),
            )
        except (PushRejected, ValueError) as exc:  # the client's fault: tell it, keep the connection
            chan.send(Op.ERROR, {"kind": type(exc).__name__, "message": str(exc)})
            return
        except Exception as exc:  # a server-side bug (e.g. in a rule): log it here AND report it
            log.exception("applying push %s of worker %s failed", m.get("seq"), worker)
            chan.send(Op.ERROR, {"kind": type(exc).__name__, "message": f"server error: {exc}"})
            return
        chan.send(Op.PUSH_REPLY, {"versions": ack.versions, "applied": ack.applied})

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        for sock in [self._listener, *self._conns_snapshot()]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()/recv()
            except OSError:
                pass  # already closed by its thread or never connected
        self._listener.close()
        for thread in self.threads():
            thread.join(self._opts.join_timeout)
            if thread.is_alive():
                log.warning(
                    "parameter-server thread %s did not stop within %.1fs",
                    thread.name,
                    self._opts.join_timeout,
                )

    def _conns_snapshot(self) -> list[socket.socket]:
        with self._lock:
            return [s for s in self._conns.values() if s is not None]


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether a request starts within ``timeout`` seconds (TLS may hold decrypted bytes already)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()  # not select(): it fails on descriptors above 1,023
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(timeout, 0) * 1000))
