"""The quorum of a per-step fault-tolerant job (driver.quorum): when a step commits, who trains
the next one, who heals whom, and what is refused; and its endpoint (driver.quorum_server):
authenticated workers only, a silent worker dropped, the healer's state relayed to the joiner."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparkdp.driver.quorum import Quorum
from sparkdp.driver.quorum_server import QuorumServer
from sparkdp.errors import AuthenticationError, ProtocolError
from sparkdp.ps.transport.base import ConnectInfo
from sparkdp.train.quorum_client import QuorumClient
from sparkdp.train.quorum_messages import JOINING, Arrival, Decision

pytestmark = pytest.mark.timeout(60)


def _started(workers: int = 3, steps: int = 10) -> Quorum:
    quorum = Quorum(workers, steps)
    for w in range(workers):
        decisions = quorum.arrive(w, Arrival(0))
    assert set(decisions) == set(range(workers))
    return quorum


def test_the_first_quorum_waits_for_every_worker_and_commits_nothing() -> None:
    quorum = Quorum(2, 5)
    assert quorum.arrive(1, Arrival(0)) == {}
    decisions = quorum.arrive(0, Arrival(0))
    assert decisions[1] == Decision(1, (0, 1), 0, commit=False) and decisions[1].rank_of(1) == 1


def test_a_resumed_quorum_starts_at_its_checkpoints_step() -> None:
    quorum = Quorum(2, 10, step=4)
    with pytest.raises(ProtocolError, match="arrived at step 0; the quorum expected 4"):
        quorum.arrive(0, Arrival(0))
    assert quorum.arrive(1, Arrival(JOINING)) == {}  # a retried task before the first step: a member
    decisions = quorum.arrive(0, Arrival(4))
    assert decisions[1] == Decision(1, (0, 1), 4, commit=False)
    quorum.arrive(0, Arrival(4, True))
    assert quorum.arrive(1, Arrival(4, True))[0].step == 5


def test_a_step_commits_when_every_member_ran_it() -> None:
    quorum = _started()
    quorum.arrive(0, Arrival(0, True))
    quorum.arrive(1, Arrival(0, True))
    decisions = quorum.arrive(2, Arrival(0, True))
    assert all(d.commit and d.step == 1 and d.quorum == 1 for d in decisions.values())  # same group


def test_a_failed_collective_drops_the_step_everywhere_and_opens_a_new_group() -> None:
    quorum = _started()
    quorum.arrive(0, Arrival(0, True))
    quorum.arrive(1, Arrival(0, False))
    decisions = quorum.arrive(2, Arrival(0, True))
    assert not any(d.commit for d in decisions.values()) and quorum.step == 0
    assert {d.quorum for d in decisions.values()} == {2} and decisions[0].members == (0, 1, 2)


def test_a_lost_member_is_dropped_at_the_boundary_and_its_step_is_run_again() -> None:
    quorum = _started()
    quorum.arrive(0, Arrival(0, True))
    quorum.arrive(2, Arrival(0, True))  # both ran step 1; worker 1 died after its all-reduce
    decisions = quorum.lose(1, "its connection closed")
    assert decisions[0] == Decision(2, (0, 2), 0, commit=False) and set(decisions) == {0, 2}
    assert quorum.records[0]["kind"] == "leave" and quorum.records[0]["worker"] == 1


def test_a_replacement_joins_at_the_next_boundary_healed_from_the_first_member() -> None:
    quorum = _started(2)
    quorum.lose(0, "gone")
    alone = quorum.arrive(1, Arrival(0, True))  # the step ran with worker 0: run again, alone
    assert alone[1] == Decision(2, (1,), 0, commit=False)
    assert quorum.arrive(0, Arrival(JOINING)) == {}  # waits for the boundary
    decisions = quorum.arrive(1, Arrival(0, True))
    assert decisions[1].commit and decisions[1].heal_to == (0,) and decisions[0].heal_from == 1
    assert decisions[0].members == (1, 0) and decisions[0].rank_of(0) == 1 and decisions[0].quorum == 3
    quorum.healed(0, 0.5, 1234)
    assert quorum.records[-1] == {**quorum.records[-1], "kind": "join", "heal_s": 0.5, "bytes": 1234}


def test_after_the_last_step_everyone_is_done_and_late_joiners_too() -> None:
    quorum = _started(2, steps=1)
    quorum.arrive(0, Arrival(0, True))
    decisions = quorum.arrive(1, Arrival(0, True))
    assert all(d.done and d.commit for d in decisions.values())
    assert quorum.arrive(0, Arrival(JOINING))[0].done


def test_no_member_left_to_heal_from_fails_the_quorum() -> None:
    quorum = _started(1)
    assert quorum.lose(0, "gone") == {} and quorum.failed is not None


def test_a_lost_worker_takes_its_replica_group_out_and_the_group_rejoins_only_whole() -> None:
    """hsdp: replica groups (0, 1) and (2, 3). Worker 1 lost: worker 0 leaves with it and waits;
    the group is admitted once 1's replacement arrives, each healed from its shard index's peer."""
    quorum = Quorum(4, 10, replica=2)
    for w in range(4):
        quorum.arrive(w, Arrival(0))
    quorum.arrive(0, Arrival(0, True))  # worker 0 ran step 1 before its group-mate was lost
    assert quorum.lose(1, "gone") == {}
    assert quorum.members == (2, 3) and quorum.benched == {0}
    assert [(r["worker"], r["kind"]) for r in quorum.records] == [(1, "leave"), (0, "leave")]
    quorum.arrive(2, Arrival(0, True))
    decisions = quorum.arrive(3, Arrival(0, True))  # the step ran with the lost group: run again
    assert set(decisions) == {2, 3} and decisions[2] == Decision(2, (2, 3), 0, commit=False)
    quorum.arrive(2, Arrival(0, True))
    assert quorum.arrive(3, Arrival(0, True))[3].commit  # worker 0 still waits: its group is not whole
    quorum.arrive(1, Arrival(JOINING))
    quorum.arrive(2, Arrival(1, True))
    decisions = quorum.arrive(3, Arrival(1, True))
    assert decisions[0].members == (2, 3, 0, 1) and decisions[0].quorum == 3
    assert (decisions[0].heal_from, decisions[1].heal_from) == (2, 3)
    assert (decisions[2].heal_to, decisions[3].heal_to) == ((0,), (1,)) and not quorum.benched
    assert [(r["worker"], r.get("healed_from")) for r in quorum.records[2:]] == [(0, 2), (1, 3)]


@pytest.mark.parametrize(
    ("worker", "arrival"), [(0, Arrival(5, True)), (0, Arrival(JOINING)), (7, Arrival(0))]
)
def test_an_arrival_out_of_step_or_of_another_job_is_refused(worker: int, arrival: Arrival) -> None:
    quorum = _started()
    with pytest.raises(ProtocolError):
        quorum.arrive(worker, arrival)


@pytest.mark.parametrize(
    "meta", [[], {"step": "1"}, {"step": -2}, {"step": True}, {"step": 1, "ok": 1}, {"step": 2**60}]
)
def test_a_malformed_arrival_is_one_protocol_error(meta: object) -> None:
    with pytest.raises(ProtocolError):
        Arrival.from_json(meta)


def test_a_decision_survives_the_wire_and_a_malformed_one_is_refused() -> None:
    decision = Decision(3, (2, 0), 7, True, heal_to=(0,))
    assert Decision.from_json(decision.to_json()) == decision
    for bad in ({}, {**decision.to_json(), "members": [-1]}, {**decision.to_json(), "commit": 1}):
        with pytest.raises(ProtocolError):
            Decision.from_json(bad)


def test_the_endpoint_refuses_a_wrong_secret_and_tensors_from_a_worker_that_heals_no_one() -> None:
    quorum = Quorum(2, 100)
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server:
        assert server.info.address.startswith("127.0.0.1:")  # the host given, never every interface
        with pytest.raises(AuthenticationError):
            QuorumClient(ConnectInfo(server.info.address, b"x" * 32), 0, wait_s=5.0)
        with pytest.raises(AuthenticationError):  # a worker number outside the job: refused at the handshake
            QuorumClient(server.info, 2, wait_s=5.0)
        client = QuorumClient(server.info, 0, wait_s=5.0)
        client.heal((1,), b"unasked")  # JSON only is allowed: the driver closes the connection
        with pytest.raises((ProtocolError, OSError)):
            client.boundary(0, None)
        client.abandon()


def test_a_silent_worker_is_dropped_and_a_replacement_healed_from_the_survivor() -> None:
    quorum = Quorum(2, 100)
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=0.5) as server, ThreadPoolExecutor(2) as pool:
        alive = QuorumClient(server.info, 0, wait_s=10.0, heartbeat_s=0.1)
        silent = QuorumClient(server.info, 1, wait_s=10.0, heartbeat_s=60.0)  # no heartbeat in this test
        first = list(pool.map(lambda c: c.boundary(0, None)[0], (alive, silent)))
        assert [d.quorum for d in first] == [1, 1]
        decision, _ = alive.boundary(0, True)  # worker 1 never arrives: dropped after 0.5 s
        assert decision.members == (0,) and not decision.commit
        assert quorum.records[0]["worker"] == 1 and "heartbeat" in quorum.records[0]["cause"]
        joiner = QuorumClient(server.info, 1, wait_s=10.0)
        joined = pool.submit(joiner.boundary, JOINING, None)
        while 1 not in quorum.arrived:
            time.sleep(0.01)
        healer, _ = alive.boundary(0, True)
        assert healer.heal_to == (1,) and healer.commit and healer.members == (0, 1)
        alive.heal((1,), b"state bytes")
        decision, state = joined.result(10)
        assert decision.heal_from == 0 and state == b"state bytes"
        while "bytes" not in quorum.records[-1]:  # noted once the relay is sent
            time.sleep(0.01)
        assert quorum.records[-1]["bytes"] == 11 and quorum.records[-1]["heal_s"] > 0
        for client in (alive, joiner):
            client.close()
        silent.abandon()


def test_a_healer_whose_decision_another_worker_completed_may_still_send_its_state() -> None:
    """The healer (worker 0) waits at the boundary first; worker 2's arrival completes the
    decision. The healer's connection, idle since its own arrival, must then take its state."""
    quorum = Quorum(3, 100)
    with QuorumServer(quorum, "127.0.0.1", heartbeat_timeout_s=5.0) as server, ThreadPoolExecutor(3) as pool:
        healer = QuorumClient(server.info, 0, wait_s=10.0, heartbeat_s=60.0)  # no frame but its own
        lost, member = (QuorumClient(server.info, w, wait_s=10.0) for w in (1, 2))
        list(pool.map(lambda c: c.boundary(0, None), (healer, lost, member)))
        lost.abandon()
        assert [d.members for d, _ in pool.map(lambda c: c.boundary(0, True), (healer, member))] == [
            (0, 2)
        ] * 2
        joiner = QuorumClient(server.info, 1, wait_s=10.0)
        joined = pool.submit(joiner.boundary, JOINING, None)
        waiting = pool.submit(healer.boundary, 0, True)
        while not {0, 1} <= set(quorum.arrived):
            time.sleep(0.01)
        assert member.boundary(0, True)[0].members == (0, 2, 1)
        decision, _ = waiting.result(10)
        assert decision.heal_to == (1,)
        healer.heal((1,), b"state bytes")
        assert joined.result(10)[1] == b"state bytes"
        for client in (healer, member, joiner):
            client.close()


def test_idle_connections_hold_a_bounded_number_of_threads_and_a_worker_still_gets_in(monkeypatch) -> None:
    import socket

    from sparkdp.driver import quorum_server

    monkeypatch.setattr(quorum_server, "MAX_HANDSHAKES", 4)
    monkeypatch.setattr(quorum_server, "HANDSHAKE_TIMEOUT_S", 1.0)
    with QuorumServer(Quorum(1, 10), "127.0.0.1") as server:
        host, port = server.info.address.rsplit(":", 1)
        idle = [socket.create_connection((host, int(port))) for _ in range(10)]  # never say a word
        time.sleep(0.3)
        assert sum(t.name.startswith("sparkdp-quorum-(") and t.is_alive() for t in threading.enumerate()) <= 4
        started = time.monotonic()
        client = QuorumClient(server.info, 0, wait_s=5.0)  # retries until a handshake slot is free
        assert client.boundary(0, None)[0].members == (0,) and time.monotonic() - started < 10
        client.close()
        for sock in idle:
            sock.close()
