"""Fuzzing a live TCP parameter server over real sockets, while an honest worker trains on it.

Two targets share one server: the handshake (HELLO/AUTH frames from a peer without a
session: bit flips, truncations, wrong and huge lengths, bad JSON, tensor descriptors,
garbage) and frames after a *valid* handshake (the fuzzer holds the secret, so it also
forges frames with correct MACs whose header fields, sequence numbers, JSON, descriptors
and payloads are hostile: these reach the decoder and the server's request handling).
Each input gets a fresh connection that the fuzzer half-closes after sending, so the
server meets end-of-stream at once instead of waiting for a timeout.

A third target floods the admission path: each input holds a burst of idle or half-sent
connections from drawn addresses in 127.0.0.2..127.0.0.40, more than the server's handshake
slots, while a fresh honest client must connect and pull within seconds.

Meanwhile an honest client pulls and pushes in another thread.  It must see no error; at
the end all its pushes are in the centre, the server still serves, every fuzz connection
is closed, and no connection thread died or hit the catch-all for unexpected errors.

``make test`` runs a quick version; ``make fuzz`` sets ``SPARKDP_FUZZ_EXAMPLES=100000``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkdp.ps import ParameterServer, codec
from sparkdp.ps.auth import NONCE_BYTES, client_proof, mac
from sparkdp.ps.codec import HEADER, HEADER_SIZE, MAGIC, PROTOCOL_VERSION, Op
from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.rules.base import Locking, UpdateRule

from .budget import examples, fuzz_settings, hang_guard

EXAMPLES = examples(300)
FUZZ = fuzz_settings(300, suppress=HealthCheck, database=False)
# per target: ~220 handshake inputs/s, ~90 after-auth inputs/s on two shared cores
pytestmark = hang_guard(300, per_second=30, floor_s=240)

HONEST = 0
SHAPES = [(64,), (3, 3)]
_CLOSE_WAIT_S = 10.0  # an input the server neither answers nor closes on within this is a hang


class HonestOnly(UpdateRule):
    """Subtracts the honest worker's pushes; counts the fuzzer's (whatever finite values they
    carry), so the centre tells exactly whether every honest push was applied."""

    locking = Locking.GLOBAL

    def __init__(self) -> None:
        self.honest = self.others = 0

    def apply(self, center, push):
        if push.worker != HONEST:
            self.others += 1
            return
        for c, g in zip(center, push.tensors, strict=True):
            c.sub_(g)
        self.honest += 1


# ------------------------------------------------------------------ frames and mutations
def _frame(op: int, seq: int, body: bytes, payload: bytes = b"", flags: int = 0) -> bytearray:
    return bytearray(
        HEADER.pack(MAGIC, PROTOCOL_VERSION, op, flags, seq, len(body), len(payload)) + body + payload
    )


_EXTREMES = [0, 1, 2**31 - 1, 2**32 - 1, 2**63, 2**64 - 1]
_FIELDS = {
    "op": (5, "B"),
    "flags": (6, "H"),
    "seq": (8, "Q"),
    "json_len": (16, "I"),
    "payload_len": (20, "Q"),
}


def _mutate(data: st.DataObject, frame: bytearray) -> bytearray:
    """A few random edits: bit flips, cuts, appended bytes, header fields set to extremes."""
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        action = data.draw(st.sampled_from(["flip", "cut", "grow", "field", "none"]), label="action")
        if action == "flip" and frame:
            i = data.draw(st.integers(0, len(frame) - 1))
            frame[i] ^= data.draw(st.integers(1, 255))
        elif action == "cut" and frame:
            frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
        elif action == "grow":
            frame += data.draw(st.binary(min_size=1, max_size=64))
        elif action == "field" and len(frame) >= HEADER_SIZE:
            offset, fmt = _FIELDS[data.draw(st.sampled_from(sorted(_FIELDS)))]
            size = {"B": 1, "H": 2, "I": 4, "Q": 8}[fmt]
            value = data.draw(st.sampled_from(_EXTREMES) | st.integers(0, 64)) % 2 ** (8 * size)
            frame[offset : offset + size] = value.to_bytes(size, "big")
    return frame


# A pool of hostile JSON values, drawn by index: a recursive text/number strategy cost several
# times the socket round trip per input, and the server's checks care about types and ranges,
# not about the spelling of a string.
_POOL = [
    None,
    True,
    False,
    0,
    1,
    -1,
    3,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    -(10**30),
    0.5,
    -0.0,
    1e308,
    "",
    "x",
    "0" * 64,
    "ff" * 32,
    "\u0000",
    "\ud800x",
    [],
    [0],
    [1, 2],
    [-1],
    [0.5],
    [None],
    [[0]],
    ["a"],
    [2**63] * 3,
    list(range(40)),
    {},
    {"a": 1},
    {"tensors": []},
    {"dtype": "float32"},
    [{"dtype": "float32", "shape": [1], "offset": 0}],
    [[[[[]]]]],
    {"k": {"k": {"k": [{}]}}},
]
_JSON_VALUES = st.sampled_from(_POOL) | st.integers(-5, 70)
_DIMS = st.sampled_from([0, 1, 2, 3, 9, 64, 2**31, 2**48, 2**63 - 1, 10**30, -1])
_DESCRIPTOR = (
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from([*codec.DTYPES, "object", "complex64", 3]),
            "shape": st.lists(_DIMS, max_size=4)
            | st.lists(st.just(0), min_size=30, max_size=70)
            | _JSON_VALUES,
            "offset": st.sampled_from([0, 64, 128, 3, -64, 2**64]) | _JSON_VALUES,
        },
    )
    | _JSON_VALUES
)
_TENSOR_LISTS = st.lists(_DESCRIPTOR, max_size=3) | _JSON_VALUES


def _valid_tensor_list(data: st.DataObject) -> list[torch.Tensor]:
    kind = data.draw(st.sampled_from(["model", "nan", "other"]), label="tensors")
    if kind == "model":
        return [torch.randn(s) for s in SHAPES]
    if kind == "nan":
        return [torch.full(s, float("nan")) for s in SHAPES]
    return [torch.ones(data.draw(st.integers(0, 5)))]


def _meta(data: st.DataObject) -> dict:
    """The fields the server reads, each either plausible or hostile."""
    meta = data.draw(
        st.dictionaries(
            st.sampled_from(["seq", "pulled", "num_samples", "local_steps", "observe", "worker", "x"]),
            _JSON_VALUES,
            max_size=3,
        ),
        label="meta",
    )
    if data.draw(st.booleans()):
        meta["seq"] = data.draw(st.integers(0, 3))
    return meta


# ------------------------------------------------------------------ connections
def _drain_until_closed(sock: socket.socket) -> None:
    """Read replies until the server closes; a server that keeps the connection is a hang."""
    deadline = time.monotonic() + _CLOSE_WAIT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("the server kept a fuzz connection open after its input ended")
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return
        except (ConnectionResetError, BrokenPipeError):
            return


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)  # end of input: the server sees it now, not after a timeout
    except OSError:  # reset, broken pipe, not connected: the server already gave up on this input
        pass
    _drain_until_closed(sock)


class Fuzzer:
    def __init__(self, endpoint) -> None:
        self.ep = endpoint
        host, port = endpoint.address.rsplit(":", 1)
        self.where = (host, int(port))
        self.connections = 0
        self.next_worker = 100

    def handshake(self, data: st.DataObject) -> None:
        self.connections += 1
        with socket.create_connection(self.where, timeout=_CLOSE_WAIT_S) as sock:
            if data.draw(st.booleans(), label="garbage only"):
                _send_and_close(sock, data.draw(st.binary(max_size=200)))
                return
            hello = bytearray()
            while (
                len(hello) < HEADER_SIZE or len(hello) < HEADER_SIZE + HEADER.unpack(hello[:HEADER_SIZE])[5]
            ):
                chunk = sock.recv(4096)
                assert chunk, "the server closed a fresh connection before HELLO"
                hello += chunk
            server_nonce = bytes.fromhex(json.loads(bytes(hello[HEADER_SIZE:]))["nonce"])
            worker = data.draw(st.integers(1, 2**63 - 1) | st.integers(-5, 0), label="worker")
            nonce = os.urandom(NONCE_BYTES)
            proof = (
                client_proof(self.ep.info.secret, server_nonce, nonce, worker)
                if worker >= 0
                else os.urandom(32)
            )
            meta = {"worker": worker, "nonce": nonce.hex(), "proof": proof.hex(), "tensors": []}
            shape = data.draw(st.sampled_from(["valid", "json", "fields", "bytes"]), label="auth")
            if shape == "json":  # any JSON object, or not JSON at all
                body = data.draw(
                    st.dictionaries(st.sampled_from([*meta, "mac_payload"]), _JSON_VALUES, max_size=5).map(
                        lambda m: json.dumps(m).encode()
                    )
                    | st.binary(max_size=100)
                )
            else:
                if shape == "fields":
                    meta[data.draw(st.sampled_from([*meta, "mac_payload"]))] = data.draw(
                        _JSON_VALUES | _TENSOR_LISTS
                    )
                body = json.dumps(meta).encode()
            frame = _frame(
                data.draw(st.sampled_from(list(Op)) if shape == "fields" else st.just(Op.AUTH)),
                data.draw(st.just(0) | st.integers(0, 2**64 - 1)),
                body,
            )
            if shape == "bytes":
                frame = _mutate(data, frame)
            _send_and_close(sock, bytes(frame))

    def after_auth(self, data: st.DataObject) -> None:
        self.connections += 1
        self.next_worker = self.next_worker + 1 if self.next_worker < 160 else 100  # some seq history per id
        options = TcpOptions(mac_payload=data.draw(st.booleans(), label="mac_payload"))
        client = TcpTransport(options).connect(
            self.ep.address, self.ep.info.secret, self.next_worker, timeout=10
        )
        try:
            chan, sock = client._chan, client._chan.sock
            out = bytearray()
            for _ in range(
                data.draw(st.sampled_from([1, 1, 1, 2, 3]), label="frames")
            ):  # mostly one: cheaper
                if data.draw(st.booleans(), label="forge"):
                    out += self._forged(data, chan)
                else:  # a well-formed frame, then byte edits: every edit breaks a MAC or the framing
                    op = data.draw(st.sampled_from([Op.PULL, Op.PUSH, Op.REPORT, Op.INIT, Op.BYE]))
                    tensors = _valid_tensor_list(data) if op in (Op.PUSH, Op.INIT) else ()
                    parts = chan.encode_frame(op, _meta(data), tensors)
                    out += _mutate(data, bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in parts)))
            _send_and_close(sock, bytes(out))
        finally:
            client._broken = "fuzzed"  # close() without a BYE: the stream is already ended
            client.close()

    def _forged(self, data: st.DataObject, chan) -> bytes:
        """A frame with correct MACs (the fuzzer holds the session keys) and hostile contents."""
        out_key, _, out_payload_key, _ = chan._keys
        op = data.draw(st.sampled_from(list(Op)) | st.integers(0, 255), label="op")
        meta = _meta(data)
        if data.draw(st.booleans(), label="hostile descriptors"):
            meta["tensors"] = data.draw(_TENSOR_LISTS)
            payload = data.draw(st.binary(max_size=256))
        else:
            descs, buffers, _ = codec.layout(_valid_tensor_list(data))
            meta["tensors"] = descs
            payload = b"".join(bytes(b) for b in buffers)
        # a declared payload length past the model's bytes must be refused at the header, never allocated
        declared = data.draw(st.just(len(payload)) | st.integers(0, 2**40), label="declared payload")
        body = data.draw(st.just(json.dumps(meta).encode()) | st.binary(max_size=64), label="body")
        flags = data.draw(st.sampled_from([0, 0, 1, 2, 0xFFFF]), label="flags")
        seq = chan.send_seq + data.draw(st.sampled_from([0, 0, 0, 1, -1]), label="seq offset")
        header = HEADER.pack(MAGIC, PROTOCOL_VERSION, op, flags, max(seq, 0), len(body), declared)
        header_mac = mac(out_key, header, body)
        frame = header + body + header_mac + payload
        if flags & codec.Flag.PAYLOAD_MAC:
            frame += mac(out_payload_key, header_mac, payload)
        chan.send_seq += 1
        return frame

    def flood(self, data: st.DataObject) -> None:
        """A burst of connections from many loopback addresses, each idle or sending a drawn
        prefix of a frame, held while an honest client connects; then all closed."""
        sources = data.draw(
            st.lists(st.integers(2, 40), min_size=1, max_size=2 * FLOOD_SLOTS), label="sources"
        )
        held = []
        try:
            for last in sources:
                self.connections += 1
                sock = socket.socket()
                held.append(sock)
                try:
                    sock.settimeout(2)
                    sock.bind((f"127.0.0.{last}", 0))
                    sock.connect(self.where)
                    start = data.draw(
                        st.sampled_from([b"", b"", bytes(_frame(Op.AUTH, 0, b'{"worker": 1'))])
                        | st.binary(max_size=40),
                        label="first bytes",
                    )
                    if start:
                        sock.sendall(start)
                except OSError:
                    pass  # the backlog is full or the server already closed it: a flood meets that too
            started = time.monotonic()
            with TcpTransport().connect(
                self.ep.address, self.ep.info.secret, HONEST + 1, timeout=10
            ) as client:
                client.pull(observe=True)
            assert time.monotonic() - started < 10
        finally:
            for sock in held:
                sock.close()


FLOOD_SLOTS = 16  # handshake slots of the flood target's server: bursts of up to twice that


# ------------------------------------------------------------------ the test
def _honest_worker(ep, stop: threading.Event, pushes: list[int], errors: list[BaseException]) -> None:
    try:
        with TcpTransport().connect(ep.address, ep.info.secret, HONEST, timeout=30) as client:
            seq = 0
            while not stop.is_set():
                versions, centre = client.pull()
                assert torch.equal(centre[0], torch.full((64,), -float(seq)))  # only its own pushes move it
                assert client.push(seq, versions, [torch.ones(s) for s in SHAPES]).applied
                seq += 1
                pushes.append(seq)
                time.sleep(0.005)  # leave the fuzzer most of the CPU (hundreds of rounds still overlap it)
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("target", ["handshake", "after_auth", "flood"])
def test_a_live_server_survives_fuzzed_connections_while_a_worker_trains(target, caplog, monkeypatch):
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    rule = HonestOnly()
    ps = ParameterServer(lambda shard: rule, [torch.zeros(s) for s in SHAPES], num_shards=1)
    # short handshake deadline: an input the fuzzer failed to end must not stall the run for long
    slots = (
        {"max_unauthenticated": FLOOD_SLOTS, "max_unauthenticated_per_source": FLOOD_SLOTS // 2}
        if target == "flood"
        else {}
    )
    ep = TcpTransport(TcpOptions(handshake_timeout=2.0, frame_timeout=5.0, **slots)).serve(ps)
    stop, pushes, errors = threading.Event(), [], []
    honest = threading.Thread(target=_honest_worker, args=(ep, stop, pushes, errors), name="honest-worker")
    fuzzer = Fuzzer(ep)
    caplog.set_level(logging.WARNING, logger="sparkdp.ps")
    started = time.monotonic()
    try:
        honest.start()

        # a flood input holds dozens of connections and one honest handshake: a tenth as many
        count = EXAMPLES if target != "flood" else max(30, EXAMPLES // 10)

        @settings(FUZZ, max_examples=count)
        @given(st.data())
        def one_input(data):
            getattr(fuzzer, target)(data)

        one_input()
        elapsed = time.monotonic() - started
        stop.set()
        honest.join(30)
        assert not honest.is_alive() and not errors, errors
        # every fuzz connection has ended on the server's side too (bounded wait for the threads)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(t.is_alive() for t in ep.threads()) > 1:
            time.sleep(0.05)
        assert sum(t.is_alive() for t in ep.threads()) == 1  # the accept thread
        assert not ep._pending and not ep._pending_from
        # the server still serves, and holds exactly the honest pushes
        with TcpTransport().connect(ep.address, ep.info.secret, HONEST, timeout=10) as late:
            n = len(pushes)
            assert n > 0 and late.last_seq == n - 1
            assert torch.equal(late.pull().tensors[0], torch.full((64,), -float(n)))
        assert rule.honest == n and ps.metrics()["pushes_applied"] == n + rule.others
        assert ep.rejected_connections <= fuzzer.connections
    finally:
        stop.set()
        honest.join(30)
        ep.close()
    assert not died, died[:3]
    unexpected = [
        r.getMessage()
        for r in caplog.records  # the catch-all's line, or a server error
        if "after an unexpected" in r.getMessage() or r.levelno >= logging.ERROR
    ]
    assert not unexpected, unexpected[:3]
    print(
        f"\n{target}: {count} inputs in {elapsed:.1f}s ({count / elapsed:.0f}/s), "
        f"{ep.rejected_connections} connections rejected, {n} honest pushes"
    )
