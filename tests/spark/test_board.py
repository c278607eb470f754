"""The driver's rendezvous board: every task gets every part, by rank, as soon as the last arrives."""

import threading
import time

import pytest

from sparkdp.errors import AuthenticationError
from sparkdp.spark import board as board_module
from sparkdp.spark.board import BoardLink, RendezvousBoard

pytestmark = pytest.mark.timeout(60)


def _gather_all(link, attempt, parts, delays):
    out, errors = {}, []

    def task(rank):
        try:
            time.sleep(delays[rank])
            out[rank] = (link.gather(rank, attempt, parts[rank]), time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(rank,)) for rank in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    return out


def test_every_task_gets_every_part_by_rank_once_the_last_arrives(monkeypatch):
    monkeypatch.setattr(board_module, "HOLD_S", 0.1)  # the first task asks again a few times
    parts = [{"port": 4321, "host": "127.0.0.1"}, {"port": 0, "host": "127.0.0.1"}, {"port": 0, "gpu": None}]
    with RendezvousBoard(3) as board:
        started = time.monotonic()
        out = _gather_all(board.link, "7.0", parts, delays=[0.0, 0.1, 0.45])
    assert [out[rank][0] for rank in range(3)] == [parts] * 3
    # each answered within a moment of the last part (Spark's allGather: a second at least)
    last_posted = started + 0.45
    assert all(out[rank][1] - last_posted < 0.5 for rank in range(3))


def test_attempts_do_not_mix():
    with RendezvousBoard(2) as board:
        first = _gather_all(board.link, "3.0", ["a0", "a1"], delays=[0, 0])
        second = _gather_all(board.link, "3.1", ["b0", "b1"], delays=[0, 0])
    assert first[0][0] == ["a0", "a1"] and second[1][0] == ["b0", "b1"]


def test_a_task_outside_the_stage_is_refused():
    with RendezvousBoard(2) as board:
        with pytest.raises(Exception, match="rendezvous|closed|connection|Protocol"):
            board.link.gather(5, "1.0", "x")


def test_a_wrong_secret_is_refused():
    with RendezvousBoard(2) as board:
        info = board.link.info
        forged = BoardLink(type(info)(info.address, b"x" * len(info.secret), info.tls_cert), 2)
        with pytest.raises(AuthenticationError):
            forged.gather(0, "1.0", "x")


def test_the_board_listens_on_loopback_only():
    with RendezvousBoard(2) as board:
        assert board.link.info.address.startswith("127.0.0.1:")
