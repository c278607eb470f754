"""Fuzzing the quorum of a per-step fault-tolerant job (driver.quorum, driver.quorum_server).

Two targets. The decoders of the quorum's messages take any JSON value and return a checked
message or raise ``ProtocolError``, nothing else. The live endpoint takes, from a peer holding the
job's secret (so past the handshake and the MACs), frames of any op with hostile JSON and tensors,
then mutated bytes; each input is a fresh connection. The endpoint must close that connection or
answer it, never hit its catch-all for unexpected errors, and at the end honest workers must still
form a quorum.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import json
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.errors import ProtocolError
from sparkdp.ps import codec
from sparkdp.ps.auth import NONCE_BYTES, SessionKeys, client_proof
from sparkdp.ps.transport.channel import Channel
from sparkdp.ps.transport.tcp_options import parse_address
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.quorum_messages import Arrival, Decision

from .budget import fuzz_settings, hang_guard

FUZZ = fuzz_settings(200, suppress=HealthCheck, database=False)
pytestmark = hang_guard(200)

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_KEYS = ["step", "ok", "to", "quorum", "members", "commit", "done", "heal_to", "heal_from", "worker"]
_META = st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), _JSON, max_size=6)


@FUZZ
@given(_JSON | _META)
def test_the_quorum_messages_decode_or_raise_a_protocol_error(value: object) -> None:
    for decode in (Arrival.from_json, Decision.from_json):
        try:
            message = decode(value)
        except ProtocolError:
            continue
        assert type(message) in (Arrival, Decision)


@pytest.fixture(scope="module")
def endpoint():
    quorum = Quorum(3, 10**6)  # worker 2 is never fuzzed: the quorum waits for it to start
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=2.0) as server:
        yield quorum, server


def _authenticated(server: QuorumServer, worker: int) -> Channel:
    """A channel past the handshake, as a worker holding the secret has."""
    host, port = parse_address(server.info.address)
    sock = socket.create_connection((host, port), timeout=5)
    chan = Channel(sock, "client", codec.Limits(), 5.0)
    hello = chan.recv(5.0)
    server_nonce, nonce = bytes.fromhex(hello.meta["nonce"]), secrets.token_bytes(NONCE_BYTES)
    proof = client_proof(server.info.secret, server_nonce, nonce, worker)
    chan.send(codec.Op.AUTH, {"worker": worker, "nonce": nonce.hex(), "proof": proof.hex()})
    chan.set_keys(SessionKeys.derive(server.info.secret, server_nonce, nonce, worker), False)
    assert chan.recv(5.0).op is codec.Op.AUTH_OK
    return chan


@FUZZ
@given(data=st.data())
def test_the_endpoint_survives_hostile_frames_from_an_authenticated_peer(endpoint, data) -> None:
    quorum, server = endpoint
    chan = _authenticated(server, data.draw(st.integers(0, 1), label="worker"))
    op = data.draw(st.sampled_from(list(codec.Op)), label="op")
    meta = data.draw(_META, label="meta")
    tensors = data.draw(
        st.lists(st.sampled_from([torch.zeros(3), torch.ones(2, dtype=torch.uint8)]), max_size=2)
    )
    try:
        parts = chan.encode_frame(op, json.loads(json.dumps(meta, default=str)), tensors)
        raw = bytearray(b"".join(bytes(p) for p in parts))
        if data.draw(st.booleans(), label="mutate") and raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
        chan.sock.sendall(raw)
        chan.sock.shutdown(socket.SHUT_WR)
        chan.sock.settimeout(5.0)
        while chan.sock.recv(65536):  # answered (a quorum reply) or closed: never left hanging
            pass
    except (OSError, ValueError):
        pass
    finally:
        chan.sock.close()
    assert server.unexpected == 0


def test_after_the_fuzzing_honest_workers_still_form_a_quorum(endpoint) -> None:
    quorum, server = endpoint
    clients = [QuorumClient(server.info, w, wait_s=10.0) for w in range(3)]
    with ThreadPoolExecutor(3) as pool:
        first = list(pool.map(lambda c: c.boundary(0, None)[0], clients))
    assert [d.members for d in first] == [(0, 1, 2)] * 3 and server.unexpected == 0
    for client in clients:
        client.close()
