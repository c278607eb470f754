"""With tls=True, a peer that starts the TLS handshake and then stalls or trickles its hello
is closed once ``handshake_timeout`` has passed in all, not per byte: Python's ssl module
bounds the whole ``do_handshake`` by the socket's timeout (a total duration since Python 3.5)."""

from __future__ import annotations

import socket
import time

import pytest

from sparkdp.ps.transport import TcpOptions
from tests.ps.conftest import make_ps

pytestmark = pytest.mark.timeout(60)

#: a TLS handshake record header (content type 22, TLS 1.0 framing) announcing a 16 KiB body
_RECORD_HEADER = bytes([22, 3, 1, 0x40, 0x00])


def _seconds_until_closed(sock: socket.socket, trickle_every: float | None, limit: float) -> float:
    """Send one byte of the announced body every ``trickle_every`` s (None: nothing) until the
    server closes the connection; the seconds that took (``limit`` if it never did)."""
    started = time.monotonic()
    sock.settimeout(trickle_every or 0.2)
    while time.monotonic() - started < limit:
        try:
            if trickle_every is not None:
                sock.sendall(b"\x01")
            if sock.recv(4096) == b"":
                break
        except TimeoutError:
            continue
        except OSError:  # reset, or a send after the server closed
            break
    return time.monotonic() - started


@pytest.mark.parametrize("trickle_every", [None, 0.2], ids=["stalls", "trickles"])
def test_a_tls_handshake_that_stalls_or_trickles_is_closed_within_the_handshake_timeout(tcp, trickle_every):
    ep = tcp(make_ps(), TcpOptions(tls=True, handshake_timeout=1.0))
    host, port = ep.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    try:
        sock.sendall(_RECORD_HEADER)
        elapsed = _seconds_until_closed(sock, trickle_every, limit=15.0)
    finally:
        sock.close()
    # each trickled byte arrives well within a per-read timeout; the deadline is the whole handshake's
    assert 0.9 <= elapsed < 4.0, f"closed after {elapsed:.1f} s with handshake_timeout 1 s"
    deadline = time.monotonic() + 5
    while ep.rejected_connections < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ep.rejected_connections == 1
