"""The background batch producer: order, errors, early stop, bounded memory."""

import threading
import time

import pytest
import torch

from sparkdp.data.prefetch import nbytes, prefetch
from sparkdp.errors import DataError


def _batches(n, rows=4, cols=3):
    for i in range(n):
        yield torch.full((rows, cols), float(i)), torch.full((rows,), i)


@pytest.mark.parametrize("depth", [0, 1, 2, 8])
def test_prefetch_yields_the_same_items_in_order(depth):
    got = list(prefetch(_batches(20), depth))
    want = list(_batches(20))
    assert len(got) == len(want) == 20
    for (gx, gy), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_prefetch_runs_in_another_thread_and_stays_ahead():
    produced = []

    def source():
        for _ in range(10):
            produced.append(threading.current_thread().name)
            yield torch.zeros(1)

    it = prefetch(source(), 3)
    try:
        next(it)
        deadline = time.monotonic() + 5
        while len(produced) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        # 1 taken + 3 queued + 1 made and waiting for room; then the producer blocks
        assert len(produced) == 5, "the producer fills the queue and then waits"
        assert set(produced) == {"sparkdp-prefetch"}
    finally:
        it.close()


def test_prefetch_respects_the_byte_budget_but_always_allows_one_batch():
    produced = []

    def source():
        for i in range(10):
            produced.append(i)
            yield torch.zeros(1000)  # 4,000 bytes each

    it = prefetch(source(), 8, max_bytes=9_000)  # room for two
    try:
        next(it)
        time.sleep(0.2)
        assert len(produced) == 4  # 1 taken + 2 queued + 1 waiting for room
    finally:
        it.close()
    assert [t.numel() for t in prefetch((torch.zeros(10_000) for _ in range(3)), 4, max_bytes=10)] == [
        10_000
    ] * 3


def test_producer_errors_reach_the_consumer_with_their_type_and_after_good_items():
    def source():
        yield torch.ones(1)
        raise DataError("bad row 7")

    it = prefetch(source(), 4)
    assert torch.equal(next(it), torch.ones(1))
    with pytest.raises(DataError, match="bad row 7"):
        next(it)


def test_closing_early_stops_the_producer_and_closes_the_source():
    closed = threading.Event()

    def source():
        try:
            for i in range(10_000):
                yield torch.tensor([i])
        finally:
            closed.set()

    before = threading.active_count()
    it = prefetch(source(), 2)
    assert next(it).item() == 0
    it.close()
    assert closed.wait(5), "the source generator was closed"
    assert threading.active_count() == before, "the producer thread ended"


def test_nbytes_counts_nested_tensors():
    assert nbytes((torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64))) == 2 * 3 * 4 + 4 * 8
    assert nbytes("not a tensor") == 0
