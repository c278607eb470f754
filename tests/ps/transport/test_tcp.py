"""The TCP transport on 127.0.0.1: correctness under threads, and attacks.

Each attack runs while an honest client is connected; the attacker's connection must
be closed, nothing it sent applied, and the honest client must keep working.
"""

import datetime
import logging
import os
import socket
import threading
import time

import pytest
import torch

from sparkdp.errors import AuthenticationError, ProtocolError
from sparkdp.ps import PushRejected, codec
from sparkdp.ps.codec import HEADER, MAGIC, Op
from sparkdp.ps.transport import ConnectFailed, TcpOptions, TcpTransport
from sparkdp.ps.transport.channel import send_buffers
from tests.ps.conftest import connect as _connect
from tests.ps.conftest import make_ps

SHAPES = [(1000,), (10, 10)]


def ones():
    return [torch.ones(s) for s in SHAPES]


def assert_closed(sock: socket.socket) -> None:
    """The server closed this connection (EOF or reset) within 10 s."""
    sock.settimeout(10)
    try:
        while sock.recv(65536):
            pass  # a reply sent before the close may still be buffered
    except ConnectionResetError:
        pass


def honest_round(client, seq):
    versions, _ = client.pull()
    assert client.push(seq, versions, ones()).applied


@pytest.fixture
def setup(tcp):
    ps = make_ps(SHAPES)
    ep = tcp(ps)
    honest = _connect(ep, 0)
    honest_round(honest, 0)
    yield ps, ep, honest
    # the honest client is unaffected by whatever the test did
    honest_round(honest, 1)
    pushes = ps.metrics()["pushes_applied"]
    assert torch.equal(ps.pull(0).tensors[0], torch.full((1000,), -float(pushes)))
    honest.close()


def test_threads_lose_no_update_over_tcp(tcp):
    ps = make_ps([(256,), (3, 3)], num_shards=2)
    ep = tcp(ps)
    errors, n_threads, n_pushes = [], 8, 200

    def worker(w):
        try:
            with _connect(ep, w) as client:
                for seq in range(n_pushes):
                    versions, _ = client.pull()
                    client.push(seq, versions, [torch.ones(256), torch.ones(3, 3)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    for t in ps.pull(0).tensors:
        assert torch.all(t == -n_threads * n_pushes)


@pytest.mark.parametrize(
    "options",
    [TcpOptions(), TcpOptions(mac_payload=True), TcpOptions(tls=True)],
    ids=["default", "mac", "tls"],
)
def test_round_trip_and_duplicates(tcp, options):
    ps = make_ps(SHAPES, num_shards=2)
    ep = tcp(ps, options)
    with _connect(ep, 4, options) as client:
        assert client.num_shards == ps.num_shards and client.last_seq == -1
        versions, center = client.pull()
        assert [t.shape for t in center] == [torch.Size(s) for s in SHAPES]
        assert client.push(0, versions, ones()).applied
        assert not client.push(0, versions, ones()).applied
        out = [torch.empty(s) for s in SHAPES]
        pulled = client.pull(out=out)
        assert pulled.tensors[0] is out[0] and torch.equal(out[1], -torch.ones(10, 10))
    with _connect(ep, 4, options) as again:  # a replacement task learns where to continue
        assert again.last_seq == 0


def test_every_connection_is_reported_with_its_count_and_where_the_worker_continues(tcp):
    """What the driver's one line about a retried asynchronous task is made of: the second
    connection of a worker, and the last push the server applied for it."""
    seen = []
    ep = tcp(
        make_ps(SHAPES), on_connect=lambda worker, times, last_seq: seen.append((worker, times, last_seq))
    )
    with _connect(ep, 1) as client:
        versions, _ = client.pull()
        for seq in range(3):
            assert client.push(seq, versions, ones()).applied
    with _connect(ep, 0):
        pass
    with _connect(ep, 1) as again:  # the retried task
        assert again.last_seq == 2
    assert seen == [(1, 1, -1), (0, 1, -1), (1, 2, 2)]


def test_binds_loopback_by_default_and_falls_back_from_a_taken_port(tcp, caplog):
    ep = tcp(make_ps())
    assert ep._listener.getsockname()[0] == "127.0.0.1" and ep.address.startswith("127.0.0.1:")
    taken = int(ep.address.rsplit(":", 1)[1])
    with caplog.at_level(logging.WARNING, logger="sparkdp.ps.transport.tcp_server"):
        other = tcp(make_ps(), port=taken)
    assert other.address != ep.address and "is taken" in caplog.text


def test_connect_failure_names_the_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused, retried until the deadline
        started = time.monotonic()
        with pytest.raises(
            ConnectFailed, match=rf"127\.0\.0\.1:{port} \(\d+ attempts.*Is the driver still running"
        ):
            TcpTransport().connect(f"127.0.0.1:{port}", os.urandom(32), 0, timeout=1)
        assert time.monotonic() - started < 3


def test_wrong_secret_is_rejected_and_nothing_applied(setup):
    ps, ep, _ = setup
    with pytest.raises(AuthenticationError, match="secret"):
        TcpTransport().connect(ep.address, os.urandom(32), 9, timeout=10)
    assert ps.last_seq(9) == -1 and ep.rejected_connections == 1


def test_non_finite_push_over_tcp_names_the_worker_and_keeps_the_connection(setup):
    ps, ep, _ = setup
    with _connect(ep, 3) as client:
        versions, before = client.pull()
        bad = ones()
        bad[1][2, 2] = float("nan")
        with pytest.raises(PushRejected, match="worker 3"):
            client.push(0, versions, bad)
        assert torch.equal(client.pull().tensors[0], before[0])
        with pytest.raises(PushRejected, match="got 1 tensors"):  # bypassing the client-side check
            client._request(Op.PUSH, {"seq": 0, "pulled": versions}, [torch.ones(3)], Op.PUSH_REPLY)
        honest_round(client, 0)  # same connection still fine


def _push_frame(client, seq=0):
    versions = [0] * client.num_shards
    return client._chan.encode_frame(Op.PUSH, {"seq": seq, "pulled": versions}, ones())


def _flip(buf, index=-1):
    b = bytearray(buf)
    b[index] ^= 1
    return bytes(b)


def test_forged_header_mac(setup):
    ps, ep, _ = setup
    attacker = _connect(ep, 5)
    parts = _push_frame(attacker)
    parts[2] = _flip(parts[2])
    send_buffers(attacker._chan.sock, parts)
    assert_closed(attacker._chan.sock)
    assert ps.last_seq(5) == -1


def test_altered_json_keeps_no_valid_mac(setup):
    ps, ep, _ = setup
    attacker = _connect(ep, 5)
    parts = _push_frame(attacker)
    parts[1] = parts[1].replace(b'"seq":0', b'"seq":7')
    send_buffers(attacker._chan.sock, parts)
    assert_closed(attacker._chan.sock)
    assert ps.last_seq(5) == -1


def test_replayed_and_reordered_frames(setup):
    ps, ep, _ = setup
    victim = _connect(ep, 6)
    parts = [bytes(memoryview(p).cast("B")) for p in _push_frame(victim)]
    send_buffers(victim._chan.sock, parts)
    assert victim._chan.recv(10).meta["applied"] is True
    send_buffers(victim._chan.sock, parts)  # replay: same sequence number
    assert_closed(victim._chan.sock)
    other = _connect(ep, 6)  # the same bytes on another connection: other session key
    send_buffers(other._chan.sock, parts)
    assert_closed(other._chan.sock)
    third = _connect(ep, 7)
    _first, second = _push_frame(third, 0), _push_frame(third, 1)
    send_buffers(third._chan.sock, second)  # reordered
    assert_closed(third._chan.sock)
    assert ps.last_seq(6) == 0 and ps.last_seq(7) == -1


def test_truncated_frame(setup):
    ps, ep, _ = setup
    attacker = _connect(ep, 5)
    frame = b"".join(bytes(memoryview(p).cast("B")) for p in _push_frame(attacker))
    attacker._chan.sock.sendall(frame[: len(frame) // 2])
    attacker._chan.sock.shutdown(socket.SHUT_WR)
    assert_closed(attacker._chan.sock)
    assert ps.last_seq(5) == -1


@pytest.mark.parametrize("authenticated", [False, True])
def test_oversized_length_field_is_refused_before_allocating(setup, caplog, authenticated):
    ps, ep, _ = setup
    huge = 2**62
    with caplog.at_level(logging.WARNING, logger="sparkdp.ps.transport.tcp_server"):
        if authenticated:
            attacker = _connect(ep, 5)
            sock, seq = attacker._chan.sock, attacker._chan.send_seq
        else:
            sock, seq = socket.create_connection(ep.address.rsplit(":", 1), timeout=10), 0
            sock.recv(4096)  # HELLO
        sock.sendall(HEADER.pack(MAGIC, codec.PROTOCOL_VERSION, Op.PUSH, 0, seq, 2, huge) + b"{}")
        assert_closed(sock)
    assert f"payload of {huge} bytes exceeds the limit" in caplog.text


def test_garbage_bytes(setup, tcp):
    ps, _, _ = setup
    ep = tcp(ps, TcpOptions(handshake_timeout=0.5))
    # the HTTP request is shorter than a frame header: the handshake deadline ends it
    for garbage in (os.urandom(200), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"S"):
        sock = socket.create_connection(ep.address.rsplit(":", 1), timeout=10)
        sock.sendall(garbage)
        assert_closed(sock)
    assert ep.rejected_connections == 3


def test_payload_mac_catches_flipped_tensor_bytes(tcp):
    ps = make_ps(SHAPES)
    ep = tcp(ps, TcpOptions(mac_payload=True))
    attacker = _connect(ep, 5)
    parts = _push_frame(attacker)
    parts[3] = _flip(memoryview(parts[3]).cast("B"), 0)  # first tensor byte
    send_buffers(attacker._chan.sock, parts)
    assert_closed(attacker._chan.sock)
    assert ps.last_seq(5) == -1


def test_header_mac_alone_does_not_cover_tensor_bytes(tcp):
    """Documents the default's threat model: payload integrity needs mac_payload=True."""
    ps = make_ps(SHAPES)
    ep = tcp(ps)
    client = _connect(ep, 5)
    parts = _push_frame(client)
    parts[3] = torch.full((1000,), 2.0).numpy().tobytes()
    send_buffers(client._chan.sock, parts)
    assert client._chan.recv(10).meta["applied"] is True
    assert torch.equal(ps.pull(0).tensors[0], torch.full((1000,), -2.0))
    client.close()


def test_client_can_demand_the_payload_mac(tcp):
    ps = make_ps(SHAPES)
    ep = tcp(ps)  # server default: header MAC only
    with _connect(ep, 1, TcpOptions(mac_payload=True)) as client:
        assert client._chan.mac_payload
        honest_round(client, 0)


def test_tls_needs_the_pinned_certificate(tcp):
    ep = tcp(make_ps(), TcpOptions(tls=True))
    assert ep.info.tls_cert.startswith("-----BEGIN CERTIFICATE-----")
    with pytest.raises((ProtocolError, OSError)):
        TcpTransport(TcpOptions(handshake_timeout=2, frame_timeout=2)).connect(
            ep.address, ep.info.secret, 0, timeout=2
        )
    other = tcp(make_ps(), TcpOptions(tls=True))
    with pytest.raises(OSError):  # ssl.SSLCertVerificationError: not the pinned certificate
        TcpTransport().connect(ep.address, ep.info.secret, 0, timeout=5, tls_cert=other.info.tls_cert)


def test_close_ends_connections_and_threads(tcp):
    ps = make_ps()
    ep = tcp(ps)
    client = _connect(ep, 0)
    client.pull()
    ep.close()
    assert not any(t.is_alive() for t in ep.threads())
    with pytest.raises((ProtocolError, OSError)):
        client.pull()
    with pytest.raises(ProtocolError, match="unusable"):
        client.pull()
    client.close()
    ep.close()  # idempotent


def test_a_flood_of_idle_connections_takes_no_threads_from_honest_workers(setup, tcp):
    ps, _, _ = setup
    ep = tcp(ps, TcpOptions(handshake_timeout=2.0, max_unauthenticated=16))
    honest = _connect(ep, 7)
    honest_round(honest, 0)
    host, port = ep.address.rsplit(":", 1)
    flood = [socket.create_connection((host, int(port)), timeout=10) for _ in range(1000)]
    try:
        # at most 16 handshake threads (plus accept + the honest connection) once the ones closed
        # for newer connections have ended, whatever arrives
        deadline = time.monotonic() + 60  # bounded; generous for a loaded machine
        while len([t for t in ep.threads() if t.is_alive()]) > 16 + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len([t for t in ep.threads() if t.is_alive()]) <= 16 + 2
        for seq in range(1, 4):
            honest_round(honest, seq)  # already connected: unaffected
        # the accept thread works through the kernel's backlog on its own time: wait for it (bounded)
        deadline = time.monotonic() + 60
        while ep.rejected_connections < 1000 - 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ep.rejected_connections >= 1000 - 16
    finally:
        for sock in flood:
            sock.close()
    honest.close()
    # the slots free up: a new honest worker connects once the idle ones are gone
    late = _connect(ep, 8)
    honest_round(late, 0)
    late.close()


def test_a_slow_loris_handshake_is_cut_at_the_deadline(setup, tcp):
    ps, _, _ = setup
    ep = tcp(ps, TcpOptions(handshake_timeout=1.0))
    sock = socket.create_connection(ep.address.rsplit(":", 1), timeout=10)
    sock.recv(4096)  # HELLO
    started = time.monotonic()
    try:
        for byte in HEADER.pack(MAGIC, codec.PROTOCOL_VERSION, Op.AUTH, 0, 0, 2, 0):
            sock.sendall(bytes([byte]))  # one byte every 0.2 s: each arrives before a per-read timeout
            time.sleep(0.2)
    except OSError:
        pass  # the server already closed it
    assert_closed(sock)
    assert time.monotonic() - started < 10
    assert ep.rejected_connections == 1


def test_a_server_without_a_centre_takes_the_first_workers_model(tcp):
    """``serve(None, initial=...)`` (sparkdp.run): the first INIT's tensors become the centre, a
    later INIT changes nothing, a later client gets the plan at once, and a client that offers
    nothing cannot pull before the centre exists."""
    from sparkdp.ps import ParameterServer
    from tests.ps.conftest import Sub

    built = []

    def build(params):
        built.append([p.clone() for p in params])
        return ParameterServer(lambda s: Sub(), params)

    ep = tcp(None, initial=build)
    early = _connect(ep, 9)
    with pytest.raises(ProtocolError, match="has no centre yet"):
        early.pull()
    first = torch.tensor([1.0, 2.0, 3.0]), torch.ones(2, 2)
    with (
        _connect(ep, 0, initial=first) as a,
        _connect(ep, 1, initial=(torch.zeros(3), torch.zeros(2, 2))) as b,
    ):
        assert len(built) == 1 and torch.equal(built[0][0], first[0])
        assert [s.shape for s in b.plan.params] == [(3,), (2, 2)]
        assert torch.equal(b.pull().tensors[0], first[0])  # worker 1's offer was not taken
        b.push(0, None, [torch.ones(3), torch.zeros(2, 2)])
        assert torch.equal(a.pull().tensors[0], first[0] - 1)
        with _connect(ep, 2) as late:  # after the centre exists: the plan comes with the handshake
            assert torch.equal(late.pull().tensors[0], first[0] - 1)
    with pytest.raises(ValueError, match="shape"):  # a worker whose model differs is refused by name
        _connect(ep, 3, initial=(torch.zeros(4), torch.zeros(2, 2)))
    early.close()
    assert len(built) == 1


def test_the_pinned_certificate_outlasts_any_job():
    """The pin is the trust anchor, so its validity must not end while a long async job runs;
    it starts a day early for executors whose clocks lag the driver's."""
    from cryptography import x509

    from sparkdp.ps.transport.tls import make_server_context

    _, pem = make_server_context()
    cert = x509.load_pem_x509_certificate(pem.encode())
    now = datetime.datetime.now(datetime.timezone.utc)
    assert cert.not_valid_before_utc <= now - datetime.timedelta(hours=1)
    assert cert.not_valid_after_utc >= now + datetime.timedelta(days=3653)


@pytest.fixture
def thread_deaths(monkeypatch):
    """Exceptions that escaped a thread (each would print a traceback and be counted nowhere)."""
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    return died


def _raw_auth(ep, meta: dict) -> socket.socket:
    """An anonymous connection that reads HELLO and sends an AUTH frame with ``meta`` as its JSON."""
    sock = socket.create_connection(ep.address.rsplit(":", 1), timeout=10)
    sock.recv(4096)  # HELLO
    body = codec.dump_json(meta)
    sock.sendall(HEADER.pack(MAGIC, codec.PROTOCOL_VERSION, Op.AUTH, 0, 0, len(body), 0) + body)
    return sock


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", [[0, 10**30], [0, 2**63 - 1, 2**63 - 1], [0]])
def test_a_handshake_frame_carrying_tensor_descriptors_is_rejected(setup, caplog, thread_deaths, shape):
    """Handshake frames carry no tensors, so no descriptor is decoded before authentication
    (torch.empty([0, 10**30]) raised TypeError, which killed the connection's thread)."""
    ps, ep, _ = setup
    meta = {
        "worker": 0,
        "nonce": "00" * 32,
        "proof": "00" * 32,
        "tensors": [{"dtype": "float32", "shape": shape, "offset": 0}],
    }
    with caplog.at_level(logging.WARNING, logger="sparkdp.ps.transport.tcp_server"):
        sock = _raw_auth(ep, meta)
        try:
            assert_closed(sock)
        finally:
            sock.close()
        deadline = time.monotonic() + 10
        while ep.rejected_connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ep.rejected_connections == 1 and not thread_deaths
    assert "handshake frame" in caplog.text and "tensor" in caplog.text


@pytest.mark.timeout(60)
def test_an_unexpected_error_in_a_connection_thread_closes_it_once_and_counts_as_rejected(
    setup, caplog, thread_deaths, monkeypatch
):
    ps, ep, _ = setup

    def broken_handshake(chan):
        raise RuntimeError("something no handler expected")

    monkeypatch.setattr(ep, "_handshake", broken_handshake)
    with caplog.at_level(logging.WARNING, logger="sparkdp.ps.transport.tcp_server"):
        with pytest.raises((ProtocolError, OSError)):
            TcpTransport().connect(ep.address, ep.info.secret, 3, timeout=2)
        deadline = time.monotonic() + 10
        while ep.rejected_connections < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
    monkeypatch.undo()  # the fixture's honest client goes on after this test
    assert not thread_deaths and ep.rejected_connections >= 1
    records = [r for r in caplog.records if "something no handler expected" in r.getMessage()]
    assert len(records) == ep.rejected_connections  # one line per connection ...
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in records)  # ... no traceback
    assert "RuntimeError" in records[0].getMessage()


def _from(source: str, address: str) -> socket.socket:
    """A connection from ``source`` (127.0.0.2, 127.0.0.3, ... are loopback too on Linux)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    try:
        sock.settimeout(2)
        sock.bind((source, 0))
        sock.connect((host, int(port)))
    except BaseException:
        sock.close()
        raise
    return sock


def _still_open(sock: socket.socket) -> bool:
    """Drain what the server sent (HELLO) without blocking; False once it closed the socket."""
    try:
        while True:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.mark.timeout(90)
def test_one_peer_holding_idle_connections_does_not_lock_honest_clients_out(tcp):
    """A peer from 127.0.0.2 keeps more idle connections open than there are handshake slots,
    reopening each one the server closes; honest clients from 127.0.0.1 still connect, pull
    and push, and the peer never holds more than its per-source share."""
    ps = make_ps(SHAPES)
    opts = TcpOptions(handshake_timeout=1.0)
    ep = tcp(ps, opts)
    stop, flooding = threading.Event(), threading.Event()
    held: list[socket.socket] = []
    errors: list[BaseException] = []
    most_held_by_peer = []

    def flood():
        try:
            ends = time.monotonic() + 60  # bounded even if the test body hangs
            while not stop.is_set() and time.monotonic() < ends:
                held[:] = [s for s in held if _still_open(s) or s.close()]
                while len(held) < opts.max_unauthenticated + 16 and not stop.is_set():
                    try:
                        held.append(_from("127.0.0.2", ep.address))
                    except OSError:
                        break  # backlog full: try again on the next sweep
                with ep._lock:
                    most_held_by_peer.append(ep._pending_from["127.0.0.0/24"])
                flooding.set()
                time.sleep(0.1)
        except BaseException as exc:
            errors.append(exc)
        finally:
            for s in held:
                s.close()

    flooder = threading.Thread(target=flood, name="flooder")
    flooder.start()
    try:
        assert flooding.wait(20)
        with _connect(ep, 0) as long_lived:
            for seq in range(6):  # over more than one handshake timeout: the peer reopens meanwhile
                with _connect(ep, 1 + seq) as client:  # a retried task, rank 0's evaluation, a probe
                    honest_round(client, 0)
                honest_round(long_lived, seq)
                time.sleep(0.3)
    finally:
        stop.set()
        flooder.join(30)
    assert not flooder.is_alive() and not errors, errors
    assert ep.rejected_connections > 0  # the peer did try for more than its share
    assert max(most_held_by_peer) <= opts.max_unauthenticated_per_source
    assert ps.metrics()["pushes_applied"] == 12
    assert torch.equal(ps.pull(0).tensors[0], torch.full((1000,), -12.0))


@pytest.mark.timeout(60)
def test_at_the_handshake_limit_a_new_connection_takes_an_idle_ones_slot(tcp):
    ps = make_ps(SHAPES)
    ep = tcp(ps, TcpOptions(handshake_timeout=30, max_unauthenticated=1))
    idle = socket.create_connection(ep.address.rsplit(":", 1), timeout=10)  # takes the only slot
    try:
        deadline = time.monotonic() + 10
        while not ep._pending and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        with _connect(ep, 0) as client:  # long before the idle one's 30 s handshake timeout
            honest_round(client, 0)
        assert time.monotonic() - started < 10
        assert_closed(idle)
        assert ep.rejected_connections == 1  # the idle connection
    finally:
        idle.close()


@pytest.mark.timeout(60)
def test_a_wrong_secret_fails_at_once_and_is_not_retried(setup):
    ps, ep, _ = setup
    started = time.monotonic()
    with pytest.raises(AuthenticationError, match="secret"):
        TcpTransport().connect(ep.address, os.urandom(32), 9, timeout=30)
    assert time.monotonic() - started < 5 and ep.rejected_connections == 1


def test_an_observers_pull_is_not_the_workers_pull(tcp):
    """Worker 0 evaluates the centre over its own connection without moving its books."""
    ps = make_ps(SHAPES)
    ep = tcp(ps)
    with _connect(ep, 0) as client:
        centre = client.pull(observe=True).tensors
        assert torch.equal(centre[0], torch.zeros(1000))
        with pytest.raises(PushRejected, match="never pulled"):  # no pull recorded
            client.push(0, None, ones())
        honest_round(client, 0)


def test_a_worker_id_outside_the_job_is_refused_at_the_handshake(tcp):
    ps = make_ps(SHAPES, worker_ids=4)
    ep = tcp(ps)
    with pytest.raises(ValueError, match="worker id 4 is not one of this job's"):
        _connect(ep, 4)
    # the server counts the refusal on its connection's thread, after its reply reached the client
    deadline = time.monotonic() + 10
    while ep.rejected_connections == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ep.rejected_connections == 1 and ps.last_seq(4) == -1
    with _connect(ep, 3) as client:
        honest_round(client, 0)


def test_a_frame_larger_than_the_model_is_refused_before_its_payload(setup):
    ps, ep, _ = setup
    attacker = _connect(ep, 5)
    versions = [0] * attacker.num_shards
    too_big = [torch.ones(2000), torch.ones(10, 10)]  # the model's first tensor has 1000 elements
    send_buffers(
        attacker._chan.sock, attacker._chan.encode_frame(Op.PUSH, {"seq": 0, "pulled": versions}, too_big)
    )
    assert_closed(attacker._chan.sock)  # at its header: its payload was never received
    assert ep.rejected_connections == 1 and ps.metrics()["rejected"] == 0
    attacker.close()


def test_a_quiet_connection_keeps_no_model_sized_buffers(tcp, monkeypatch):
    from sparkdp.ps.transport import channel, tcp_server

    monkeypatch.setattr(tcp_server, "KEEP_BUFFERS_S", 0.2)
    released = []
    original = channel.Channel.release_buffer
    monkeypatch.setattr(
        channel.Channel, "release_buffer", lambda self: (released.append(self.role), original(self))
    )
    ps = make_ps(SHAPES)
    ep = tcp(ps)
    with _connect(ep, 0) as client:
        honest_round(client, 0)  # the server now holds a push buffer and pull buffers
        deadline = time.monotonic() + 10
        while not released and time.monotonic() < deadline:
            time.sleep(0.05)
        assert released == ["server"]
        honest_round(client, 1)  # and allocates them again when the worker comes back
    assert torch.equal(ps.pull(0).tensors[0], torch.full((1000,), -2.0))
