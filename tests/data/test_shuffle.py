"""The bounded shuffle buffer and re-batching (pure tensors, no I/O)."""

import pytest
import torch

from sparkdp.data.shuffle import rebatch, seeded_generator


def _chunks(n, size):
    for start in range(0, n, size):
        ids = torch.arange(start, min(n, start + size))
        yield ids.float().unsqueeze(1), ids


def _ids(batches):
    return torch.cat([y for _x, y in batches])


@pytest.mark.parametrize("n,chunk,batch", [(100, 7, 10), (100, 30, 8), (5, 2, 10), (64, 64, 64)])
def test_rebatch_without_shuffle_keeps_order_and_sizes(n, chunk, batch):
    out = list(rebatch(_chunks(n, chunk), batch))
    assert torch.equal(_ids(out), torch.arange(n))
    assert [len(y) for _x, y in out[:-1]] == [batch] * (len(out) - 1)
    assert 0 < len(out[-1][1]) <= batch
    for x, y in out:  # features stay aligned with labels
        assert torch.equal(x.squeeze(1).long(), y)


@pytest.mark.parametrize("capacity", [3, 16, 50, 1000])
def test_shuffle_buffer_is_a_seeded_permutation(capacity):
    def run(seed):
        return _ids(rebatch(_chunks(300, 13), 8, buffer_rows=capacity, generator=seeded_generator(seed, 0)))

    a, b, c = run(0), run(0), run(1)
    assert sorted(a.tolist()) == list(range(300)), "every row exactly once"
    assert torch.equal(a, b), "same seed, same order"
    assert not torch.equal(a, c), "another seed, another order"
    assert not torch.equal(a, torch.arange(300))


def test_shuffle_buffer_is_bounded():
    """The first batch comes out long before the stream ends: the buffer never holds it all."""
    consumed = []

    def stream():
        for i, chunk in enumerate(_chunks(10_000, 100)):
            consumed.append(i)
            yield chunk

    it = rebatch(stream(), 10, buffer_rows=200, generator=seeded_generator(3))
    next(it)
    assert len(consumed) <= 4  # ~ (capacity + batch) / chunk chunks, not 100


def test_shuffle_buffer_mixes_beyond_one_chunk():
    out = _ids(rebatch(_chunks(1000, 100), 50, buffer_rows=500, generator=seeded_generator(0)))
    first = out[:50]
    assert first.max() >= 100, "rows of later chunks reach the first batch"


def test_seeded_generator_differs_by_part():
    draws = {
        tuple(torch.randperm(10, generator=seeded_generator(0, e, r)).tolist())
        for e in range(3)
        for r in range(3)
    }
    assert len(draws) == 9
