"""Options and small helpers shared by the TCP server and client."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from sparkdp.errors import AuthenticationError, ConfigError
from sparkdp.ps import codec
from sparkdp.ps.server import PushRejected

ERROR_KINDS: dict[str, type[Exception]] = {
    "PushRejected": PushRejected,
    "ValueError": ValueError,
    "AuthenticationError": AuthenticationError,
}


@dataclass(frozen=True)
class TcpOptions:
    """Knobs of the TCP transport (the server's ``mac_payload`` is binding for its clients).

    Args:
        mac_payload: MAC the tensor bytes too (see :mod:`sparkdp.ps.auth`; ~1.7 GB/s per core).
        tls: encrypt with a self-signed certificate generated at serve time.
        limits: largest accepted frame.
        handshake_timeout / frame_timeout / idle_timeout: seconds, see the module docstring.
        socket_buffer: SO_SNDBUF/SO_RCVBUF bytes; ``None`` keeps Linux's autotuning.
        join_timeout: how long close() waits for each thread.
        max_unauthenticated: connections allowed at once before their handshake succeeds, so a
            flood of idle or half-open connections from peers without the secret cannot take
            threads and memory from the workers (each one is also closed after
            ``handshake_timeout``).  At the limit a new connection takes the slot of the oldest
            handshake of the network prefix holding the most: an idle peer's slot goes to the
            next arrival, and an honest client, whose handshake lasts milliseconds, gets in
            while a flood goes on (it retries, with backoff, a connection closed before its
            handshake ended).
        max_unauthenticated_per_source: how many of those may come from one network prefix
            (IPv4 /24, IPv6 /64: one host, or one attacker's block of addresses); a new
            connection from a prefix at its limit takes the slot of that prefix's oldest
            handshake, so one network cannot take the slots of the others.
        max_connections: authenticated connections allowed at once.
    """

    mac_payload: bool = False
    tls: bool = False
    limits: codec.Limits = field(default_factory=codec.Limits)
    handshake_timeout: float = 10.0
    frame_timeout: float = 60.0
    idle_timeout: float = 1800.0
    socket_buffer: int | None = None
    join_timeout: float = 5.0
    max_unauthenticated: int = 128
    max_unauthenticated_per_source: int = 64
    max_connections: int = 1024


#: the network prefix lengths a source counts by (see ``max_unauthenticated_per_source``)
PREFIX_V4, PREFIX_V6 = 24, 64


def source_prefix(host: str) -> str:
    """The network ``host`` belongs to, as handshakes are counted (an IPv4-mapped IPv6 address as IPv4)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # not an IP address (never from accept() on an IP socket): count it alone
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    bits = PREFIX_V4 if address.version == 4 else PREFIX_V6
    return str(ipaddress.ip_network(f"{address}/{bits}", strict=False))


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"parameter-server address {address!r} is not 'host:port'.")
    return host.strip("[]"), int(port)


def tune_socket(sock: socket.socket, opts: TcpOptions) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # request/reply: no Nagle delay
    if opts.socket_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, opts.socket_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, opts.socket_buffer)
