"""A worker out of memory, explained with what the job's model state needs per worker.

The worker says it ran out and under what limit (spark/worker_errors.py); the driver knows the
model and the optimizer, so it adds their bytes: parameters + gradients + the optimizer's
tensors of the parameters' size (what ``costmodel.state_bytes`` counts and ``sparkdp plan`` prints).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..costmodel import size_text
from ..errors import WorkerOutOfMemory
from ..train.loop import FitSpec
from ..train.memory import optimizer_states


def replica_state_bytes(spec: FitSpec) -> int:
    """Parameters + gradients + optimizer state of one whole replica of ``spec``'s model."""
    params = [p for p in spec.model.parameters() if p.requires_grad]
    factory = spec.optimizer
    states = optimizer_states(factory.cls, factory.kwargs)
    return sum(p.numel() * p.element_size() for p in params) * (2 + states)


def explained(exc: WorkerOutOfMemory, spec: FitSpec, workers: int) -> WorkerOutOfMemory:
    """``exc``'s one line, with the model state's bytes and what to do under this strategy."""
    who = f"worker {exc.rank}" if exc.rank is not None else "a worker"
    bound = f"limit {size_text(exc.limit_bytes)}" if exc.limit_bytes else "no limit it could read"
    whole = replica_state_bytes(spec)
    if spec.strategy.name == "fsdp":
        per_worker = -(-whole // workers)
        line = (
            f"{who} ran out of memory ({bound}) under strategy='fsdp': the model's state needs about "
            f"{size_text(whole)}, {size_text(per_worker)} on each of {workers} workers, plus the "
            "gathered blocks and activations; use more workers, a smaller batch_size, or more "
            "memory per worker (docs/guide/strategies.md)"
        )
    else:
        line = (
            f"{who} ran out of memory ({bound}): the model's state needs about {size_text(whole)} per "
            "replica; strategy='fsdp' shards it over the workers (docs/guide/strategies.md)"
        )
    err = WorkerOutOfMemory(line)
    err.rank, err.limit_bytes = exc.rank, exc.limit_bytes
    return err


@contextmanager
def out_of_memory_explained(spec: FitSpec, workers: int) -> Iterator[None]:
    """Raise a worker's out-of-memory failure inside the block as :func:`explained`'s line."""
    try:
        yield
    except WorkerOutOfMemory as exc:
        raise explained(exc, spec, workers) from None
