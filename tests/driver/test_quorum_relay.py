"""The quorum endpoint's heal relay when the healer already waits at the endpoint."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.quorum_messages import JOINING

pytestmark = pytest.mark.timeout(60)


def test_a_healer_waiting_at_the_endpoint_before_the_last_arrival_still_heals() -> None:
    """The healer arrives first and waits for its decision, which another worker's arrival takes:
    its state frame must pass the endpoint's payload limit all the same."""
    quorum = Quorum(3, 100)
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server, ThreadPoolExecutor(3) as pool:
        healer, lost, last = (QuorumClient(server.info, w, wait_s=10.0) for w in range(3))
        list(pool.map(lambda c: c.boundary(0, None), (healer, lost, last)))
        lost.abandon()
        decided = pool.submit(healer.boundary, 0, True)
        while 0 not in quorum.arrived:
            time.sleep(0.01)
        last.boundary(0, True)  # worker 1 is dropped: the survivors run step 0 again
        decided.result(10)
        decided = pool.submit(healer.boundary, 0, True)
        while 0 not in quorum.arrived:  # the healer waits at the endpoint before the others arrive
            time.sleep(0.01)
        joiner = QuorumClient(server.info, 1, wait_s=10.0)
        joined = pool.submit(joiner.boundary, JOINING, None)
        while 1 not in quorum.arrived:
            time.sleep(0.01)
        last.boundary(0, True)  # this arrival takes the decision that makes worker 0 the healer
        decision, _ = decided.result(10)
        assert decision.heal_to == (1,)
        healer.heal((1,), b"state bytes")
        decision, state = joined.result(10)
        assert decision.heal_from == 0 and state == b"state bytes"
        assert [r["kind"] for r in quorum.records] == ["leave", "join"]
        for client in (healer, last, joiner):
            client.close()
