"""Run a function on N gloo processes on 127.0.0.1 (the `distributed` test tier).

``backend`` and ``device`` choose another process group (the GPU tests: NCCL at world size 1,
gloo with CUDA tensors on one GPU); left out, the workers use gloo on the CPU."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int,
    fn: Callable,
    world_size: int,
    port: int,
    outdir: str,
    args: tuple,
    backend: str | None = None,
    device: str = "cpu",
) -> None:
    from sparkdp.comm.torch_dist import TorchCollective

    torch.set_num_threads(1)
    coll = TorchCollective(backend=backend, device=device).setup(
        master_addr="127.0.0.1", master_port=port, rank=rank, world_size=world_size, timeout_s=60
    )
    try:
        result = fn(coll, *args)
        torch.save(result, os.path.join(outdir, f"rank{rank}.pt"))
    except BaseException:
        Path(outdir, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        coll.teardown()


def run_workers(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout_s: float = 120,
    backend: str | None = None,
    device: str = "cpu",
) -> list[Any]:
    """Run ``fn(collective, *args)`` on ``world_size`` spawned processes; return results by rank.

    ``fn`` must be importable (module level). A hang fails after ``timeout_s``. ``backend`` and
    ``device`` are :class:`~sparkdp.comm.torch_dist.TorchCollective`'s (default: gloo on the CPU).
    """
    port = free_port()
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(
            _entry,
            args=(fn, world_size, port, outdir, args, backend, device),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        try:
            import time

            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"distributed test did not finish within {timeout_s} s")
        except mp.ProcessRaisedException as exc:
            errs = "\n".join(p.read_text() for p in Path(outdir).glob("*.err"))
            raise AssertionError(f"a worker failed:\n{errs or exc}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        # results are our own files written by our own child processes (trusted)
        return [torch.load(os.path.join(outdir, f"rank{r}.pt"), weights_only=True) for r in range(world_size)]
