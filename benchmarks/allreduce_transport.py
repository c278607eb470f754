"""Same-host all-reduce: sparkdp's shared-memory reducer vs gloo's TCP, side by side.

    python benchmarks/allreduce_transport.py [--world 2] [--reps 30]

``world`` processes on 127.0.0.1 form one gloo process group. For each tensor size,
both transports all-reduce (sum) the same float32 tensor ``reps`` times, interleaved
call by call so machine noise hits both alike; the script prints median and 90th
percentile milliseconds per call and the ratio. Two ranks also time the shared-memory
reducer's general algorithm (two barriers, as more ranks use) beside their own (one).
3.27 M floats is the 2-conv CNN's gradient (13 MB), what ``allreduce`` moves every step of
the Fashion-MNIST benchmark; 680,000 about the small GPT's of benchmarks/lm_tokens.py (2.7 MB).
The processes are otherwise idle: in training, both transports also wait for the
slowest rank, which this does not measure.
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

SIZES = (65_536, 262_144, 680_000, 1_000_000, 3_274_634, 16_000_000)


def _worker(rank: int, world: int, port: int, reps: int, queue) -> None:
    from sparkdp.comm.shm import SharedMemoryReducer
    from sparkdp.comm.torch_dist import TorchCollective

    torch.set_num_threads(1)
    coll = TorchCollective().setup(master_addr="127.0.0.1", master_port=port, rank=rank, world_size=world)
    try:
        reducer = SharedMemoryReducer.connect(coll, slot_bytes=max(SIZES) * 4)
        assert reducer is not None, "the ranks could not share /dev/shm"
        for n in SIZES:
            t = torch.full((n,), float(rank + 1))
            ways = ("gloo", "shm", "shm-two-barriers") if world == 2 else ("gloo", "shm")
            times: dict[str, list[float]] = {name: [] for name in ways}
            one_barrier_up_to = reducer.sum_all_up_to
            for i in range(reps + 3):
                for name in ways[i % len(ways) :] + ways[: i % len(ways)]:
                    t.fill_(float(rank + 1))
                    coll.barrier()
                    reducer.sum_all_up_to = 0 if name == "shm-two-barriers" else one_barrier_up_to
                    start = time.perf_counter()
                    if name == "gloo":
                        dist.all_reduce(t)
                    else:
                        reducer.all_reduce_(t)
                    if i >= 3:  # the first calls warm caches and gloo's buffers
                        times[name].append(time.perf_counter() - start)
                    expected = world * (world + 1) / 2
                    assert float(t[0]) == expected and float(t[-1]) == expected, (name, float(t[0]))
            if rank == 0:
                queue.put((n, times))
    finally:
        coll.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, args.world, port, args.reps, queue)) for r in range(args.world)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in SIZES]
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")

    def ms(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=10)[8] * 1e3 if q == 0.9 else statistics.median(values) * 1e3

    rows = []
    for n, times in results:
        rows.append(
            [
                f"{n:,} ({n * 4 / 1e6:.1f} MB)",
                ms(times["gloo"], 0.5),
                ms(times["gloo"], 0.9),
                ms(times["shm"], 0.5),
                ms(times["shm"], 0.9),
                ms(times["gloo"], 0.5) / ms(times["shm"], 0.5),
                *([ms(times["shm-two-barriers"], 0.5)] if "shm-two-barriers" in times else []),
            ]
        )
    print(
        f"all-reduce (sum) of float32 tensors, {args.world} processes on one host, {args.reps} interleaved "
        f"calls each; machine {machine_info()}\n"
    )
    print(
        markdown_table(
            [
                "floats",
                "gloo median ms",
                "gloo p90 ms",
                "shared memory median ms",
                "shared memory p90 ms",
                "speed-up (medians)",
                *(["shared memory, two barriers, median ms"] if args.world == 2 else []),
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
