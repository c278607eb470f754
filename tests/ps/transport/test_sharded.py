"""K servers, each holding a key range, against one server holding everything: same centre.

Every update rule is elementwise, so splitting the keys over servers must not change what the
centre becomes for the same pushes in the same order; the reference is one ParameterServer
behind one TCP endpoint, the other K of them behind K endpoints and a ShardedClient."""

import threading

import pytest
import torch

from sparkdp.ps import ParameterServer
from sparkdp.ps.sharding import ShardPlan
from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.ps.transport.sharded import ShardedTransport
from sparkdp.rules import RULES, RuleSpec
from sparkdp.rules.base import UpdateRule

SHAPES = [(40, 30), (30,), (7, 5, 3), (3,)]
pytestmark = pytest.mark.timeout(120)


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _payloads(worker: int, step: int):
    g = torch.Generator().manual_seed(1000 * worker + step)
    return [0.1 * torch.randn(s, generator=g) for s in SHAPES]


def _rounds(connect):
    """Two workers interleaved so that pushes are stale: a fixed order of pulls and pushes."""
    a, b = connect(0), connect(1)
    try:
        va, _ = a.pull()
        vb, _ = b.pull()
        for step in range(4):
            assert a.push(step, va, _payloads(0, step), num_samples=8).applied
            assert b.push(step, vb, _payloads(1, step), num_samples=8).applied
            va, _ = a.pull()
            if step % 2:
                vb, _ = b.pull()
        assert not a.push(3, va, _payloads(0, 3)).applied  # a repeat is acknowledged, not applied
        return a.pull(observe=True).tensors
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("rule", sorted(RULES.available()))
@pytest.mark.parametrize("options", [TcpOptions(), TcpOptions(mac_payload=True)], ids=["plain", "mac"])
def test_k_servers_end_with_the_centre_of_one_server_for_every_rule(rule, options):
    spec = RuleSpec(rule, {"num_workers": 2})
    transport = TcpTransport(options)
    one = ParameterServer(lambda s: spec.create(), _params())
    plan = ShardPlan.build(_params(), 3, min_split_bytes=256)
    assert plan.num_shards == 3
    dense = _params()
    servers = [
        ParameterServer(lambda s: spec.create(), [p.clone() for p in plan.views(dense, s)]) for s in range(3)
    ]
    secret = b"j" * 32
    endpoints = [transport.serve(one, secret=secret)] + [transport.serve(s, secret=secret) for s in servers]
    try:
        reference = _rounds(lambda w: transport.connect(endpoints[0].address, secret, w))
        sharded = ShardedTransport(transport, plan)
        result = _rounds(lambda w: sharded.connect(tuple(e.address for e in endpoints[1:]), secret, w))
    finally:
        for e in endpoints:
            e.close()
    for r, s in zip(reference, result, strict=True):
        torch.testing.assert_close(s, r, rtol=0, atol=0)
    assert all(s.metrics()["pushes_applied"] == one.metrics()["pushes_applied"] == 8 for s in servers)
    assert all(s.metrics()["staleness"] == one.metrics()["staleness"] for s in servers)


def test_one_secret_for_every_server_and_a_wrong_count_of_addresses_is_refused():
    params = _params()
    plan = ShardPlan.build(params, 2, min_split_bytes=256)
    spec = RuleSpec("asgd", {"num_workers": 1, "lr": 1.0})
    transport = TcpTransport()
    servers = [
        ParameterServer(lambda s: spec.create(), [p.clone() for p in plan.views(params, s)]) for s in range(2)
    ]
    secret = b"k" * 32
    endpoints = [transport.serve(s, secret=secret) for s in servers]
    try:
        sharded = ShardedTransport(transport, plan)
        with pytest.raises(ValueError, match="1 server addresses for a model split into 2 key ranges"):
            sharded.connect((endpoints[0].address,), secret, 0)
        client = sharded.connect(tuple(e.address for e in endpoints), secret, 0)
        try:
            versions, centre = client.pull()
            for c, p in zip(centre, params, strict=True):
                assert torch.equal(c, p)
            ones = [torch.ones(s) for s in SHAPES]
            ack = client.push(0, versions, ones)
            assert ack.applied and len(ack.versions) == client.num_shards
            out = [torch.empty(s) for s in SHAPES]
            client.pull(out=out)
            for o, p in zip(out, params, strict=True):
                assert torch.equal(o, p - 1)
        finally:
            client.close()
    finally:
        for e in endpoints:
            e.close()


def test_pushes_reach_the_servers_at_once():
    """Both servers hold a push open until the other has it too: only parallel sends finish."""
    params = _params()
    plan = ShardPlan.build(params, 2, min_split_bytes=256)
    both = threading.Barrier(2, timeout=10)

    class WaitForTheOther(UpdateRule):
        def apply(self, center, push):
            both.wait()  # a BrokenBarrierError after 10 s if the client sent one server at a time

    transport = TcpTransport()
    secret = b"s" * 32
    servers = [
        ParameterServer(lambda s: WaitForTheOther(), [p.clone() for p in plan.views(params, s)])
        for s in range(2)
    ]
    endpoints = [transport.serve(s, secret=secret) for s in servers]
    try:
        client = ShardedTransport(transport, plan).connect(tuple(e.address for e in endpoints), secret, 0)
        try:
            versions, _ = client.pull()
            assert client.push(0, versions, [torch.zeros(s) for s in SHAPES]).applied
        finally:
            client.close()
    finally:
        for e in endpoints:
            e.close()


def test_a_reconnecting_worker_continues_after_the_smallest_last_push_and_nothing_lands_twice():
    """Server 0 applied pushes 0-2 of worker 0, server 1 only 0-1 (the worker failed between the
    two sends of push 2): the worker continues at 2, which server 0 acknowledges without applying."""
    params = _params()
    plan = ShardPlan.build(params, 2, min_split_bytes=256)
    spec = RuleSpec("asgd", {"num_workers": 1, "lr": 1.0})
    servers = [
        ParameterServer(lambda s: spec.create(), [p.clone() for p in plan.views(params, s)]) for s in range(2)
    ]
    ones = [torch.ones(s) for s in SHAPES]
    for seq in range(3):
        for s, server in enumerate(servers):
            if seq < 2 or s == 0:
                server.push(
                    0, seq, None if seq else [0] * server.num_shards, [p.clone() for p in plan.views(ones, s)]
                )
            server.pull(0)
    transport, secret = TcpTransport(), b"r" * 32
    endpoints = [transport.serve(s, secret=secret) for s in servers]
    try:
        client = ShardedTransport(transport, plan).connect(tuple(e.address for e in endpoints), secret, 0)
        try:
            assert [c.last_seq for c in client.clients] == [2, 1] and client.last_seq == 1
            versions, _ = client.pull()
            assert not client.push(2, versions, ones).applied  # server 0 had it
            centre = client.pull().tensors
        finally:
            client.close()
    finally:
        for e in endpoints:
            e.close()
    for c, p in zip(centre, params, strict=True):  # every key got each of the pushes 0, 1, 2 once
        torch.testing.assert_close(c, p - 3)
    assert [s.metrics()["duplicates_dropped"] for s in servers] == [1, 0]


def test_an_exchange_is_a_push_then_a_pull_on_every_server_with_the_pushes_taking_turns():
    params = _params()
    plan = ShardPlan.build(params, 3, min_split_bytes=256)
    order: list[tuple[str, int]] = []

    class Log(UpdateRule):
        def __init__(self, shard):
            self.shard = shard

        def apply(self, center, push):
            for c, g in zip(center, push.tensors, strict=True):
                c.sub_(g)
            order.append(("push", self.shard))

        def on_pull(self, worker, center):
            order.append(("pull", self.shard))

    transport, secret = TcpTransport(), b"e" * 32
    servers = [
        ParameterServer(lambda _s, s=s: Log(s), [p.clone() for p in plan.views(params, s)]) for s in range(3)
    ]
    endpoints = [transport.serve(s, secret=secret) for s in servers]
    try:
        client = ShardedTransport(transport, plan).connect(tuple(e.address for e in endpoints), secret, 0)
        try:
            versions, _ = client.pull()
            order.clear()
            ack, pulled = client.exchange(0, versions, _payloads(0, 0))
            assert ack.applied and pulled.versions == ack.versions == [1] * client.num_shards
            reference = client.pull(observe=True).tensors
        finally:
            client.close()
    finally:
        for e in endpoints:
            e.close()
    for got, want, p, g in zip(pulled.tensors, reference, params, _payloads(0, 0), strict=True):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, p - g)
    pushes = [s for what, s in order if what == "push"]
    assert pushes == [0, 1, 2], order  # one after the other, up this worker's link
    for s in range(3):  # every server got the push before the pull
        assert order.index(("push", s)) < order.index(("pull", s)), order
