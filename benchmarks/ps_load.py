"""Parameter-server load: many client processes pushing and pulling at once, and nothing lost.

One real :class:`~sparkdp.ps.ParameterServer` behind a :class:`~sparkdp.ps.transport.TcpTransport`
endpoint in this process (127.0.0.1, real sockets, the default options: authenticated
handshake, a MAC on every frame). ``--clients`` processes (multiprocessing, spawn), each a
TCP client with its own worker id, loop pull -> push for ``--seconds`` with a model of
``--numel`` float32 parameters in four tensors.

The rule is ASGD with a plain SGD server step at learning rate 1 (globally locked), so every
applied push ``g`` does ``centre -= g`` exactly. Client ``w``'s push number ``s`` is
``k * (j + 1)`` in every element of tensor ``j``, with the small integer ``k = 1 + (w + s) % 4``;
each client reports the sum of the ``k`` of its acknowledged pushes. The sums stay far below
2**24, where float32 holds every integer, so the final centre must equal
``initial - (j + 1) * sum(k)`` element for element. The script exits non-zero if it does not,
if the server's applied-push counter differs from the acknowledged pushes the clients
counted, or if any push was rejected, dropped as a duplicate or left unacknowledged.

Reported: round-trip latency p50/p99 of push and of pull (client side, around each call),
pushes applied (the server's counter against the clients' count), round trips per second and
parameter bytes moved per second, and this process' resident memory (the server's: the
clients are other processes) before the clients connect, at its peak and after they finish.

    python benchmarks/ps_load.py                    # 32 clients, 60 s, 1,000,000 parameters
    python benchmarks/ps_load.py --clients 4 --seconds 10 --numel 100000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from typing import Any

import psutil
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_info, markdown_table, write_json  # noqa: E402

from sparkdp.ps import ParameterServer  # noqa: E402
from sparkdp.ps.transport import TcpTransport  # noqa: E402
from sparkdp.rules.asgd import ASGD  # noqa: E402

FRACTIONS = (0.6, 0.3, 0.09)  # one big FC-like weight, two medium tensors, the rest
MULTIPLIERS = 4  # k in 1..4
EXACT_LIMIT = 2**24  # every integer up to this is exact in float32
START_TIMEOUT_S = 600.0  # 32 spawned interpreters importing torch on 2 cores take a while


def shapes(numel: int) -> list[int]:
    sizes = [int(numel * f) for f in FRACTIONS]
    return [*sizes, numel - sum(sizes)]


def initial_centre(numel: int) -> list[torch.Tensor]:
    # integer starting values, different per tensor, so a centre that was never written or was
    # written from the wrong tensor cannot pass the check
    return [torch.full((n,), float(10 * (j + 1))) for j, n in enumerate(shapes(numel))]


def percentile(sorted_values: list[float], q: float) -> float:
    return (
        sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
        if sorted_values
        else float("nan")
    )


# --------------------------------------------------------------------------- client process


def client(
    worker: int, address: str, secret: bytes, numel: int, go_connect: Any, start: Any, stop: Any, conn: Any
) -> None:
    """One worker: connect when told, then pull -> push until ``stop``; results to ``conn`` as JSON."""
    # 33 processes share a few cores: OpenMP spin-waits of one process' torch threads would starve the others
    torch.set_num_threads(1)
    result: dict[str, Any] = {"worker": worker}
    try:
        pushes = {
            k: [torch.full((n,), float(k * (j + 1))) for j, n in enumerate(shapes(numel))]
            for k in range(1, MULTIPLIERS + 1)
        }
        out = [torch.empty(n) for n in shapes(numel)]
        conn.send_bytes(b'{"stage": "imported"}')
        if not go_connect.wait(START_TIMEOUT_S):
            raise TimeoutError("the parent never said to connect")
        ps = TcpTransport().connect(address, secret, worker, timeout=120.0)
        try:
            conn.send_bytes(b'{"stage": "connected"}')
            if not start.wait(START_TIMEOUT_S):
                raise TimeoutError("the parent never said to start")
            push_s, pull_s, sum_k, acked, not_applied, seq = [], [], 0, 0, 0, 0
            first = time.monotonic()
            while not stop.is_set():
                t0 = time.perf_counter()
                versions = ps.pull(out=out).versions
                t1 = time.perf_counter()
                k = 1 + (worker + seq) % MULTIPLIERS
                ack = ps.push(seq, versions, pushes[k])
                t2 = time.perf_counter()
                pull_s.append(t1 - t0)
                push_s.append(t2 - t1)
                seq += 1
                if ack.applied:
                    acked += 1
                    sum_k += k
                else:
                    not_applied += 1
            last = time.monotonic()
        finally:
            ps.close()
        result.update(
            stage="done",
            sent=seq,
            acked=acked,
            not_applied=not_applied,
            sum_k=sum_k,
            push_s=push_s,
            pull_s=pull_s,
            first=first,
            last=last,
        )
    except BaseException as exc:  # reported to the parent, which fails the run
        result.update(stage="error", error=f"{type(exc).__name__}: {exc}")
    # JSON, not multiprocessing's pickling: the parent never unpickles what a client sends
    conn.send_bytes(json.dumps(result).encode())
    conn.close()


# --------------------------------------------------------------------------- server side


class RssSampler:
    """This process' peak resident memory, sampled every ``interval_s`` in a thread."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self._thread = threading.Thread(target=self._run, name="ps-load-rss", daemon=True)
        self.interval_s = interval_s

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _receive(worker: int, conn: Any, timeout: float, what: str) -> dict[str, Any]:
    if not conn.poll(timeout):
        raise TimeoutError(f"client {worker} sent nothing within {timeout:.0f} s while {what}.")
    try:
        message = json.loads(conn.recv_bytes())
    except EOFError:
        raise RuntimeError(
            f"client {worker} exited while {what}, without a result (see its output above)."
        ) from None
    if message.get("stage") == "error":
        raise RuntimeError(f"client {worker} failed: {message['error']}")
    return message


def run_load(clients: int, seconds: float, numel: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    server = ParameterServer(lambda shard: ASGD(lr=1.0), initial_centre(numel))
    initial = [t.clone() for t in server.pull(worker=clients).tensors]
    proc = psutil.Process()
    go_connect, start, stop = ctx.Event(), ctx.Event(), ctx.Event()
    procs, pipes = [], []
    with TcpTransport().serve(server) as endpoint, RssSampler() as rss:
        rss_before = proc.memory_info().rss
        try:
            for w in range(clients):
                parent_end, child_end = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=client,
                    name=f"ps-load-client-{w}",
                    daemon=True,
                    args=(
                        w,
                        endpoint.address,
                        endpoint.info.secret,
                        numel,
                        go_connect,
                        start,
                        stop,
                        child_end,
                    ),
                )
                p.start()
                child_end.close()
                procs.append(p)
                pipes.append(parent_end)
            # connect only once every client has imported torch: a handshake starved of CPU by
            # 32 interpreters starting up could run past the server's handshake timeout
            for w, conn in enumerate(pipes):
                _receive(w, conn, START_TIMEOUT_S, "starting")
            go_connect.set()
            for w, conn in enumerate(pipes):
                _receive(w, conn, START_TIMEOUT_S, "connecting")
            start.set()
            time.sleep(seconds)
            stop.set()
            results = [
                _receive(w, conn, 300.0, "finishing its last round trip") for w, conn in enumerate(pipes)
            ]
            for p in procs:
                p.join(60)
        finally:
            stop.set()
            start.set()
            go_connect.set()  # a client still waiting to connect or start sees stop at once
            for p in procs:
                p.join(10)
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(10)
            for conn in pipes:
                conn.close()
        rss_after = proc.memory_info().rss
        centre = server.pull(worker=clients).tensors
        metrics = server.metrics()
    sum_k = sum(r["sum_k"] for r in results)
    acked = sum(r["acked"] for r in results)
    sent = sum(r["sent"] for r in results)
    expected = [init - (j + 1) * sum_k for j, init in enumerate(initial)]
    centre_exact = all(torch.equal(c, e) for c, e in zip(centre, expected, strict=True))
    push_s = sorted(x for r in results for x in r["push_s"])
    pull_s = sorted(x for r in results for x in r["pull_s"])
    elapsed = max(r["last"] for r in results) - min(r["first"] for r in results)
    problems = []
    largest = max(
        float(t.abs().max()) for t in expected
    )  # every push subtracts: the centre only moves one way
    if largest >= EXACT_LIMIT:
        problems.append(
            f"the centre reaches {largest:,.0f}, beyond float32's exact integers (2**24): the check "
            "cannot be exact; run fewer seconds or clients"
        )
    if not centre_exact:
        worst = max(float((c - e).abs().max()) for c, e in zip(centre, expected, strict=True))
        problems.append(
            f"the centre differs from initial - sum of the acknowledged pushes (by up to {worst:g})"
        )
    if metrics["pushes_applied"] != acked:
        problems.append(
            f"the server applied {metrics['pushes_applied']:,} pushes, the clients had "
            f"{acked:,} acknowledged as applied"
        )
    if acked != sent:
        problems.append(f"{sent - acked:,} of {sent:,} pushes were acknowledged but not applied")
    if metrics["rejected"] or metrics["duplicates_dropped"]:
        problems.append(
            f"{metrics['rejected']} push(es) rejected, {metrics['duplicates_dropped']} dropped as duplicates"
        )
    if not push_s:
        problems.append("no push completed")
    model_bytes = 4 * numel
    return {
        "clients": clients,
        "seconds": seconds,
        "numel": numel,
        "elapsed_s": elapsed,
        "pushes_sent": sent,
        "pushes_acked": acked,
        "pushes_applied": metrics["pushes_applied"],
        "pulls": metrics["pulls"],
        "centre_exact": centre_exact,
        "problems": problems,
        "round_trips_per_s": len(push_s) / elapsed if elapsed > 0 else float("nan"),
        "mb_per_s": 2 * model_bytes * len(push_s) / elapsed / 1e6 if elapsed > 0 else float("nan"),
        "push_p50_ms": 1e3 * percentile(push_s, 0.50),
        "push_p99_ms": 1e3 * percentile(push_s, 0.99),
        "pull_p50_ms": 1e3 * percentile(pull_s, 0.50),
        "pull_p99_ms": 1e3 * percentile(pull_s, 0.99),
        "rss_before_mb": rss_before / 2**20,
        "rss_peak_mb": rss.peak / 2**20,
        "rss_after_mb": rss_after / 2**20,
        "staleness_max": max(metrics["staleness"], default=0),
        "machine": machine_info(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32, help="client processes (default 32)")
    p.add_argument(
        "--seconds", type=float, default=60.0, help="how long the clients push and pull (default 60)"
    )
    p.add_argument(
        "--numel",
        type=int,
        default=1_000_000,
        help="float32 parameters in the model (default 1,000,000 = 4 MB)",
    )
    p.add_argument("--json-out", help="also write the figures as JSON here")
    args = p.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.numel < len(FRACTIONS) + 1:
        p.error(f"--clients must be >= 1, --seconds > 0 and --numel >= {len(FRACTIONS) + 1}.")
    r = run_load(args.clients, args.seconds, args.numel)
    print(
        f"{r['clients']} client processes x {r['seconds']:g} s, {r['numel']:,} parameters, on "
        f"{r['machine']['cpus']} CPU(s)"
    )
    print(
        markdown_table(
            ["figure", "value"],
            [
                ["round trips (pull + push) per s", r["round_trips_per_s"]],
                ["parameter bytes moved, MB/s", r["mb_per_s"]],
                ["push round trip p50 / p99, ms", f"{r['push_p50_ms']:.2f} / {r['push_p99_ms']:.2f}"],
                ["pull round trip p50 / p99, ms", f"{r['pull_p50_ms']:.2f} / {r['pull_p99_ms']:.2f}"],
                [
                    "pushes applied: server counter / clients' acknowledged",
                    f"{r['pushes_applied']:,} / {r['pushes_acked']:,}",
                ],
                ["pushes sent", r["pushes_sent"]],
                ["largest staleness", r["staleness_max"]],
                ["centre = initial - sum of pushes, exactly", r["centre_exact"]],
                [
                    "server RSS before / peak / after, MB",
                    f"{r['rss_before_mb']:.0f} / {r['rss_peak_mb']:.0f} / {r['rss_after_mb']:.0f}",
                ],
            ],
        )
    )
    if args.json_out:
        write_json(args.json_out, r)
    if r["problems"]:
        raise SystemExit("ps_load: FAIL: " + "; ".join(r["problems"]))
    print("ps_load: PASS: every acknowledged push applied exactly once; the centre is exact")


if __name__ == "__main__":
    main()
