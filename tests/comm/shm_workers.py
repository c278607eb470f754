"""Worker functions for the shared-memory all-reduce tests (module level so spawn can import them)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sparkdp.comm import shm


def rank_tensor(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Small integers, so every dtype (bf16 included) sums them exactly in any order."""
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def reduce_many(coll, slot_bytes: int):
    reducer = shm.SharedMemoryReducer.connect(coll, slot_bytes=slot_bytes)
    assert reducer is not None, "ranks on one host must get a shared-memory reducer"
    out = {"results": []}
    # odd lengths, several chunks per call, and calls back to back (the alternating slot sets)
    for n, dtype in [
        (50_021, torch.float32),
        (3, torch.float64),
        (70_001, torch.bfloat16),
        (50_021, torch.float32),
    ]:
        t = rank_tensor(coll.rank, n, dtype)
        reducer.all_reduce_(t.view(-1), scale=None)
        out["results"].append(t)
    mean = rank_tensor(coll.rank, 64, torch.float32).view(8, 8)
    reducer.all_reduce_(mean, scale=1.0 / coll.world_size)
    out["mean"] = mean
    for bad in (torch.ones(4, dtype=torch.int64), torch.ones(4, 4).t()):
        try:
            reducer.all_reduce_(bad)
            out.setdefault("accepted", []).append(str(bad.dtype))
        except ValueError as exc:
            out.setdefault("refused", []).append(str(exc))
    wrapped = shm.SharedMemoryCollective(coll, reducer, min_bytes=1024)
    low = torch.tensor([float(coll.rank)])
    wrapped.all_reduce(low, "min")  # not a sum: the process group's
    big = torch.full((4096,), float(coll.rank + 1))
    wrapped.all_reduce(big, "mean")  # 16 KiB >= 1 KiB: the mapping's
    out["wrapped"] = (low.item(), big[0].item(), big[-1].item())
    out["barriers"] = barriers_and_bits(coll, 0 if coll.world_size == 2 else coll.world_size)
    # rank 0 removed the files before their first reductions, which every rank's reductions waited for
    out["leftovers"] = sorted(p.name for p in Path("/dev/shm").glob("sparkdp-reduce-*"))
    return out


def connect_when_one_rank_cannot_map(coll):
    if coll.rank == 1:  # as if rank 1 were on another host: rank 0's file is not there
        shm._open = lambda message: None
    reducer = shm.SharedMemoryReducer.connect(coll)
    return {
        "reducer": reducer is not None,
        "leftovers": sorted(p.name for p in Path("/dev/shm").glob(f"sparkdp-reduce-{os.getpid()}-*")),
    }


def barriers_and_bits(coll, one_barrier_up_to: int):
    """Barriers per chunk with the default algorithm and with one barrier for worlds up to
    ``one_barrier_up_to``; the results of both on random floats, whose sums depend on the order."""
    reducer = shm.SharedMemoryReducer.connect(coll, slot_bytes=65536)
    assert reducer is not None, "ranks on one host must get a shared-memory reducer"
    calls = [0]
    barrier = reducer._barrier

    def counted() -> None:
        calls[0] += 1
        barrier()

    reducer._barrier = counted  # type: ignore[method-assign]
    out = {}
    default = getattr(reducer, "sum_all_up_to", 0)
    for name, up_to in (("default", default), ("forced", one_barrier_up_to)):
        reducer.sum_all_up_to = up_to
        calls[0] = 0
        t = torch.randn(50_021, generator=torch.Generator().manual_seed(7 + coll.rank)) * 1e3
        reducer.all_reduce_(t, scale=1.0 / coll.world_size)  # 4 chunks of 16,384 floats
        out[name] = {"result": t, "barriers": calls[0]}
    return out
