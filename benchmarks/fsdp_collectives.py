"""fsdp's collectives against all-reduce on gloo: what the cost model's 1.5x assumes.

    python benchmarks/fsdp_collectives.py [--world 2] [--reps 20] [--floats 3274634]

``world`` processes on 127.0.0.1 form one gloo process group and time, interleaved call by
call, a ring all-reduce of ``floats`` float32 values (``allreduce``'s step), an all-gather of
1/world of them into the whole tensor and a reduce-scatter of the whole into 1/world
(``fsdp``'s step: two all-gathers and one reduce-scatter with ``reshard_after_forward``). The
cost model prices an all-gather and a reduce-scatter at half an all-reduce each, so fsdp's step
at 1.5 all-reduces; the last column is what gloo measured. 3.27 M floats is the 2-conv CNN.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_info, markdown_table  # noqa: E402

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def _worker(rank: int, world: int, port: int, floats: int, reps: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        whole, shard = torch.ones(floats), torch.ones(floats // world)
        # FSDP2's calls (older torch names them all_gather_into_tensor and reduce_scatter_tensor)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        calls = {
            "all_reduce": lambda: dist.all_reduce(whole),
            "all_gather": lambda: all_gather(whole, shard),
            "reduce_scatter": lambda: reduce_scatter(shard, whole),
        }
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(reps + 3):
            for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                dist.barrier()
                start = time.perf_counter()
                calls[kind]()
                if i >= 3:  # the first calls warm gloo's buffers
                    times[kind].append(time.perf_counter() - start)
        if rank == 0:
            queue.put(times)
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--floats", type=int, default=3_274_634)
    args = parser.parse_args()
    floats = args.floats // args.world * args.world  # whole shards
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, args.world, port, floats, args.reps, queue))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    times = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    step = 2 * ms["all_gather"] + ms["reduce_scatter"]
    print(
        f"gloo, {args.world} processes on one host, {floats * 4 / 1e6:.1f} MB, medians of {args.reps} interleaved calls; machine {machine_info()}\n"
    )
    print(
        markdown_table(
            [
                "all-reduce ms",
                "all-gather ms",
                "reduce-scatter ms",
                "fsdp step ms (2 AG + RS)",
                "fsdp / all-reduce (model: 1.5)",
            ],
            [[ms["all_reduce"], ms["all_gather"], ms["reduce_scatter"], step, step / ms["all_reduce"]]],
        )
    )


if __name__ == "__main__":
    main()
