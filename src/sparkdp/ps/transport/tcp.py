"""Authenticated TCP transport: one thread per connection, binds 127.0.0.1 unless told.

Threads, not asyncio: the GIL is released during socket I/O, hashing and torch ops,
and a blocking request/reply loop is easy to bound with timeouts.  Every blocking call
has one: connect and handshake (``handshake_timeout``), waiting for the next request
(``idle_timeout``: raise it if a worker computes longer than that between two calls),
and each frame once started (``frame_timeout``, per socket operation).  ``close()``
shuts the listener and every connection down and joins the threads.  Security: see
:mod:`sparkdp.ps.auth` (threat model) and :mod:`sparkdp.ps.transport.channel` (checks).
"""

from __future__ import annotations

from sparkdp.ps.auth import check_secret, new_secret
from sparkdp.ps.transport.base import Transport
from sparkdp.ps.transport.tcp_client import TcpClient
from sparkdp.ps.transport.tcp_options import TcpOptions, format_address, parse_address
from sparkdp.ps.transport.tcp_server import TcpEndpoint

__all__ = ["TcpClient", "TcpEndpoint", "TcpOptions", "TcpTransport", "format_address", "parse_address"]


class TcpTransport(Transport):
    """Factory for TCP endpoints and clients sharing one :class:`TcpOptions`."""

    def __init__(self, options: TcpOptions | None = None) -> None:
        self.options = options or TcpOptions()

    def serve(
        self, server, host="127.0.0.1", port=0, *, secret=None, reports=None, initial=None, on_connect=None
    ) -> TcpEndpoint:
        """Listen for workers; ``server`` None with ``reports``: a monitoring-only endpoint; with
        ``initial``: a server built by ``initial(tensors)`` from the first worker's model;
        ``on_connect(worker, times, last_seq)`` hears of every authenticated worker connection."""
        return TcpEndpoint(
            server,
            host,
            port,
            new_secret() if secret is None else check_secret(secret),
            self.options,
            reports=reports,
            initial=initial,
            on_connect=on_connect,
        )

    def connect(self, address, secret, worker_id, *, timeout=30.0, tls_cert=None, initial=None) -> TcpClient:
        """``initial``: this worker's tensors, offered as the centre to a server started without one."""
        return TcpClient(address, secret, worker_id, timeout, tls_cert, self.options, initial=initial)
