"""Re-batching with a bounded shuffle buffer.

Streams (Arrow record batches from Parquet row groups or Spark partitions) arrive
in chunks whose size has nothing to do with the training batch size, and in
storage order. :func:`rebatch` turns a stream of ``(features, labels)`` chunks
into batches of exactly ``batch_size`` rows (the last one may be short) and,
when ``buffer_rows > 0``, mixes rows through a fixed buffer of ``buffer_rows``
rows: memory stays bounded however large the stream is, and each emitted row is
a uniform draw from what the buffer holds at that time (like ``tf.data``'s
``shuffle(buffer_size)``). A buffer at least as large as the stream gives a
uniform permutation of the whole stream.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence

import torch

from .base import WorkerData

Chunk = Sequence[torch.Tensor]


def rank_segments(
    sizes: Sequence[int], order: Sequence[int], *, rank: int, world_size: int, pad: bool = True
) -> list[tuple[int, int, int]]:
    """The ``(unit, first, end)`` row ranges rank ``rank`` reads when units of ``sizes`` rows are
    laid end to end in ``order`` (file row groups, database key blocks).

    With ``pad`` every rank gets ``ceil(rows / world_size)`` rows, the last rank wrapping around
    to the first rows like torch's ``DistributedSampler`` (equal batches on every rank); without
    it the rows are split without repetition (evaluation).
    """
    n = sum(sizes)
    if pad:
        per = -(-n // world_size)
        lo, hi = rank * per, (rank + 1) * per
    else:
        lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    out: list[tuple[int, int, int]] = []
    while lo < hi:  # walk [lo, hi) over the units laid end to end, wrapping at n
        start = lo % n
        stop = start + min(hi - lo, n - start)
        offset = 0
        for unit in order:
            a, b = max(start, offset), min(stop, offset + sizes[unit])
            if a < b:
                out.append((unit, a - offset, b - offset))
            offset += sizes[unit]
            if offset >= stop:
                break
        lo += stop - start
    return out


def unit_order(count: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """The order an epoch reads ``count`` units in: storage order, or a permutation seeded by (seed, epoch)."""
    return (
        torch.randperm(count, generator=seeded_generator(seed, epoch)).tolist()
        if shuffle
        else list(range(count))
    )


def seeded_generator(*parts: int) -> torch.Generator:
    """A torch generator seeded from several integers (seed, epoch, rank) without collisions
    between nearby tuples."""
    value = 0x9E3779B9
    for p in parts:
        value = (value * 1_000_003 + int(p) + 0x7F4A7C15) % (2**63 - 1)
    return torch.Generator().manual_seed(value)


def _cat(parts: list[Chunk]) -> tuple[torch.Tensor, ...]:
    if len(parts) == 1:
        return tuple(parts[0])
    return tuple(torch.cat(cols) for cols in zip(*parts, strict=True))


def _take(chunk: Chunk, start: int, stop: int) -> tuple[torch.Tensor, ...]:
    return tuple(t[start:stop] for t in chunk)


def rebatch(
    chunks: Iterable[Chunk],
    batch_size: int,
    *,
    buffer_rows: int = 0,
    generator: torch.Generator | None = None,
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Yield ``batch_size``-row batches from ``chunks`` (tuples of equally long tensors).

    Args:
        batch_size: rows per emitted batch; only the final batch may be shorter.
        buffer_rows: 0 keeps the stream order; otherwise rows are shuffled through
            a buffer of this many rows.
        generator: the seeded source of randomness (same seed -> same order).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    if buffer_rows > 0:
        chunks = _swap_through_buffer(chunks, buffer_rows, generator)
    carry: tuple[torch.Tensor, ...] | None = None
    for chunk in chunks:
        n, pos = len(chunk[0]), 0
        if n == 0:
            continue
        if carry is not None:  # complete the partial batch left by the previous chunk
            need = batch_size - len(carry[0])
            if n < need:
                carry = _cat([carry, chunk])
                continue
            yield _cat([carry, _take(chunk, 0, need)])
            carry, pos = None, need
        while n - pos >= batch_size:  # whole batches are views of the chunk: no copy
            yield _take(chunk, pos, pos + batch_size)
            pos += batch_size
        if pos < n:
            carry = _take(chunk, pos, n)
    if carry is not None:
        yield carry


def _swap_through_buffer(
    chunks: Iterable[Chunk], capacity: int, generator: torch.Generator | None
) -> Iterator[tuple[torch.Tensor, ...]]:
    """A fixed buffer of ``capacity`` rows: once full, each incoming row takes the slot of a
    uniformly chosen buffered row, which is emitted instead (tf.data's shuffle buffer, done
    k rows at a time). Cost per row is O(1) copies, independent of ``capacity``; at the end
    the buffer is emitted in a random permutation."""
    buffer: tuple[torch.Tensor, ...] | None = None
    filled = 0
    for chunk in chunks:
        n, pos = len(chunk[0]), 0
        if buffer is None and n:
            buffer = tuple(torch.empty((capacity,) + t.shape[1:], dtype=t.dtype) for t in chunk)
        while pos < n:
            assert buffer is not None
            if filled < capacity:  # filling up: nothing comes out yet
                take = min(n - pos, capacity - filled)
                for b, t in zip(buffer, chunk, strict=True):
                    b[filled : filled + take] = t[pos : pos + take]
                filled, pos = filled + take, pos + take
                continue
            take = min(n - pos, capacity)
            slots = torch.randperm(capacity, generator=generator)[:take]
            # index_select / index_copy_ copy whole rows: ~2x faster than b[slots] on wide rows
            out = tuple(b.index_select(0, slots) for b in buffer)
            for b, t in zip(buffer, chunk, strict=True):
                b.index_copy_(0, slots, t[pos : pos + take])
            pos += take
            yield out
    if buffer is not None and filled:
        perm = torch.randperm(filled, generator=generator)
        yield tuple(b[:filled].index_select(0, perm) for b in buffer)


class UnitData(WorkerData):
    """WorkerData stored in units of rows (Parquet row groups, blocks of Caffe records), each rank
    reading its :func:`rank_segments` of a per-epoch :func:`unit_order`, rows mixed by :func:`rebatch`.

    Subclasses give :meth:`unit_rows`, :meth:`read` and ``shuffle_buffer``; ``can_shuffle``
    False keeps storage order even when the loop asks for shuffling."""

    shuffle_buffer: int
    can_shuffle = True

    @abstractmethod
    def unit_rows(self) -> list[int]:
        """Rows per unit, in storage order."""

    @abstractmethod
    def read(
        self, segments: list[tuple[int, int, int]], *, seed: int, epoch: int, rank: int
    ) -> Iterator[Chunk]:
        """The ``(features, labels)`` chunks of ``segments``, in order."""

    def segments(
        self, *, rank: int, world_size: int, epoch: int, seed: int, shuffle: bool, pad: bool = True
    ) -> list[tuple[int, int, int]]:
        """The ``(unit, first, end)`` row ranges rank ``rank`` reads in ``epoch``, in reading order.

        With ``pad`` every rank gets ``ceil(rows / world_size)`` rows (the last wraps around to
        the first ones); without it the rows are split without repetition (for evaluation).
        """
        sizes = self.unit_rows()
        order = unit_order(len(sizes), epoch, seed, shuffle and self.can_shuffle)
        return rank_segments(sizes, order, rank=rank, world_size=world_size, pad=pad)

    def batches(
        self, *, rank: int, world_size: int, epoch: int, batch_size: int, seed: int, shuffle: bool = True
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        shuffle = shuffle and self.can_shuffle
        segs = self.segments(rank=rank, world_size=world_size, epoch=epoch, seed=seed, shuffle=shuffle)
        yield from rebatch(
            self.read(segs, seed=seed, epoch=epoch, rank=rank),
            batch_size,  # type: ignore[misc]  # rebatch yields tuple[Tensor, ...]: these chunks are (features, labels)
            buffer_rows=self.shuffle_buffer if shuffle else 0,
            generator=seeded_generator(seed, epoch, rank),
        )

    def eval_batches(
        self, *, rank: int, world_size: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        segs = self.segments(rank=rank, world_size=world_size, epoch=0, seed=0, shuffle=False, pad=False)
        yield from rebatch(self.read(segs, seed=0, epoch=0, rank=rank), batch_size)  # type: ignore[misc]  # rebatch yields tuple[Tensor, ...]: these chunks are (features, labels)
