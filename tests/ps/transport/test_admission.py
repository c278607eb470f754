"""Admission of connections before their handshake, under a flood from many source addresses.

The flooder holds idle connections from 127.0.0.2 to 127.0.0.40 (loopback only), reopening
each one the server closes, while honest clients from 127.0.0.1 connect: each must get in
within seconds, with the server's default options.
"""

import socket
import threading
import time

import pytest

from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.ps.transport.tcp_options import source_prefix
from tests.ps.conftest import make_ps
from tests.ps.transport.test_tcp import SHAPES, _from, _still_open, honest_round

SOURCES = [f"127.0.0.{i}" for i in range(2, 41)]


class Flood:
    """Threads that keep ``per_source`` idle connections open from each source (bounded in time)."""

    def __init__(self, address: str, per_source: int, threads: int = 4, seconds: float = 40.0) -> None:
        self.address, self.per_source, self.seconds = address, per_source, seconds
        self.stop, self.opened, self.errors = threading.Event(), 0, []
        groups = [SOURCES[i::threads] for i in range(threads)]
        self.threads = [threading.Thread(target=self._run, args=(g,), name="flooder") for g in groups]

    def _run(self, sources: list[str]) -> None:
        held: dict[str, list[socket.socket]] = {s: [] for s in sources}
        ends = time.monotonic() + self.seconds  # stops by itself even if the test body hangs
        try:
            while not self.stop.is_set() and time.monotonic() < ends:
                for source, socks in held.items():
                    socks[:] = [s for s in socks if _still_open(s) or s.close()]
                    while len(socks) < self.per_source and not self.stop.is_set():
                        try:
                            socks.append(_from(source, self.address))
                            self.opened += 1
                        except OSError:
                            break  # backlog full: the next sweep tries again
                time.sleep(0.001)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            for socks in held.values():
                for s in socks:
                    s.close()

    def __enter__(self) -> "Flood":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads) and not self.errors, self.errors


def test_sources_are_counted_by_network_prefix():
    assert source_prefix("127.0.0.2") == source_prefix("127.0.0.40") == "127.0.0.0/24"
    assert source_prefix("10.1.2.3") != source_prefix("10.1.3.3")
    assert source_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert source_prefix("2001:db8:0:1::5") == source_prefix("2001:db8:0:1:ffff::9") == "2001:db8:0:1::/64"


@pytest.mark.timeout(120)
def test_honest_clients_get_in_within_seconds_while_many_addresses_flood(tcp):
    ps = make_ps(SHAPES)
    opts = TcpOptions()  # the defaults must hold
    ep = tcp(ps, opts)
    # far more idle connections than slots, from 39 addresses
    per_source = 2 * opts.max_unauthenticated // len(SOURCES) + 2
    with Flood(ep.address, per_source) as flood:
        deadline = time.monotonic() + 30
        while flood.opened < 2 * opts.max_unauthenticated and time.monotonic() < deadline:
            time.sleep(0.05)
        assert flood.opened >= 2 * opts.max_unauthenticated
        for worker in range(5):
            started = time.monotonic()
            with TcpTransport().connect(ep.address, ep.info.secret, worker, timeout=4) as client:
                honest_round(client, 0)
            assert time.monotonic() - started < 4
        assert ep.rejected_connections > 0  # the flood did take slots and lose them
    assert ps.metrics()["pushes_applied"] == 5


@pytest.mark.timeout(60)
def test_a_failed_handshake_is_counted_once_even_if_a_newcomer_arrives_before_it_is_cleaned_up(
    tcp, monkeypatch
):
    """A connection whose handshake fails is rejected once. While its thread is still on its way
    out (here: held in the warning it logs), a newcomer from the same prefix must not find its
    slot taken and evict it, which would count the same connection twice."""
    from sparkdp.ps.transport import tcp_server

    logging_failure, release = threading.Event(), threading.Event()
    warn = tcp_server.log.warning

    def held_warning(msg, *args, **kw):
        if msg.startswith("closing connection"):
            logging_failure.set()
            release.wait(10)
        warn(msg, *args, **kw)

    monkeypatch.setattr(tcp_server.log, "warning", held_warning)
    ep = tcp(make_ps(SHAPES), TcpOptions(max_unauthenticated_per_source=1))
    bad = _from("127.0.0.2", ep.address)
    newcomer = None
    try:
        bad.sendall(b"\xff" * 64)  # not a frame: the handshake fails
        assert logging_failure.wait(10)
        newcomer = _from("127.0.0.3", ep.address)  # same /24: at the limit of one slot per prefix
        time.sleep(0.5)  # the accept loop admits it (and, were the slot still held, evicts the old one)
        newcomer.settimeout(None)  # MSG_DONTWAIT answers at once only on a blocking socket
        assert _still_open(newcomer)  # admitted, not closed
    finally:
        release.set()
        bad.close()
        if newcomer is not None:
            newcomer.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(t.is_alive() for t in ep.threads()) > 1:
        time.sleep(0.05)
    assert ep.rejected_connections == 1
