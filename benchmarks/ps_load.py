"""Parameter-server load: many concurrent clients pushing and pulling for a bounded time.

``--clients`` threads (each its own authenticated TCP connection, its own worker id) loop
pull -> push of a ones-tensor for ``--seconds`` on 127.0.0.1 against one server using an
exact rule (``centre -= push``, globally locked). At the end the centre must equal minus
the number of applied pushes in every element (no lost or doubled update); the report gives
push round-trip latency p50/p99, pushes/s, and the process' resident memory before and after
(bounded: the server keeps no per-push state).

    python benchmarks/ps_load.py --clients 32 --seconds 60
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psutil
import torch

from sparkdp.ps import ParameterServer
from sparkdp.ps.transport import TcpTransport
from sparkdp.rules.base import Locking, UpdateRule


class Subtract(UpdateRule):
    locking = Locking.GLOBAL

    def apply(self, center, push):
        for c, g in zip(center, push.tensors, strict=True):
            c.sub_(g)


def run_load(clients: int, seconds: float, numel: int = 100_000) -> dict[str, float]:
    torch.set_num_threads(1)
    server = ParameterServer(lambda shard: Subtract(), [torch.zeros(numel)])
    transport = TcpTransport()
    rss_before = psutil.Process().memory_info().rss
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    with transport.serve(server) as endpoint:
        stop = time.monotonic() + seconds

        def client(worker: int) -> None:
            try:
                conn = transport.connect(endpoint.address, endpoint.info.secret, worker, timeout=30)
                ones, seq = [torch.ones(numel)], 0
                try:
                    while time.monotonic() < stop:
                        versions, _ = conn.pull()
                        started = time.perf_counter()
                        assert conn.push(seq, versions, ones).applied
                        latencies[worker].append(time.perf_counter() - started)
                        seq += 1
                finally:
                    conn.close()
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        if errors or any(t.is_alive() for t in threads):
            raise RuntimeError(f"{len(errors)} client(s) failed: {errors[:3]}")
        centre = server.pull(worker=clients).tensors[0]
    applied = server.metrics()["pushes_applied"]
    every = sorted(x for per in latencies for x in per)
    exact = bool(torch.equal(centre, torch.full((numel,), -float(applied))))
    return {"clients": clients, "seconds": seconds, "pushes": len(every), "applied": applied, "exact": exact,
            "pushes_per_s": len(every) / seconds, "p50_ms": 1e3 * statistics.median(every),
            "p99_ms": 1e3 * every[int(0.99 * (len(every) - 1))],
            "rss_before_mb": rss_before / 2**20, "rss_after_mb": psutil.Process().memory_info().rss / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--numel", type=int, default=100_000, help="float32 parameters (default 100,000 = 400 kB)")
    args = p.parse_args()
    r = run_load(args.clients, args.seconds, args.numel)
    print(f"{r['clients']} clients x {r['seconds']:.0f} s, {args.numel:,} parameters: {r['pushes']:,} pushes "
          f"({r['pushes_per_s']:,.0f}/s), applied {r['applied']:,}, centre exact: {r['exact']}; push latency "
          f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; RSS {r['rss_before_mb']:.0f} -> "
          f"{r['rss_after_mb']:.0f} MB")
    if not r["exact"] or r["applied"] != r["pushes"]:
        raise SystemExit("lost or doubled updates")


if __name__ == "__main__":
    main()
