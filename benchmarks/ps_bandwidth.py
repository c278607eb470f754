"""Parameter-server bandwidth on loopback: raw TCP vs sparkdp push+pull.

(a) raw: one process ``sendall``\\ s a buffer of the model's size, another ``recv_into``\\ s
    a preallocated buffer and acks — the ceiling for one direction;
(b) sparkdp: a worker pushes the whole model (gradients) and pulls it back through the
    authenticated TCP transport to a server in another process; reported as GB/s of
    parameters moved (2 x model bytes per round trip) and as a ratio to (a), with the
    default options (header MAC) and with ``mac_payload=True``.

The three measurements are interleaved rep by rep against long-lived peer processes, so
that load from other processes on the machine hits them alike; medians are reported.

Run:  python benchmarks/ps_bandwidth.py [--sizes 1e6,1e7,1e8] [--reps 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

import torch

from sparkdp.ps import ParameterServer, new_secret
from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.rules.base import UpdateRule

# Server and client are two processes on what may be a 2-core box: OpenMP spin-waits of
# one process' torch threads would starve the other.
torch.set_num_threads(1)


class SGD(UpdateRule):
    def apply(self, center, push):
        for c, g in zip(center, push.tensors, strict=True):
            c.sub_(g, alpha=1e-3)


def model(n: int) -> list[torch.Tensor]:
    """~n float32 parameters in four tensors of 60/30/9/1 % (one big FC-like weight)."""
    sizes = [int(n * f) for f in (0.6, 0.3, 0.09)]
    return [torch.zeros(s) for s in sizes] + [torch.zeros(n - sum(sizes))]


def _raw_server(conn, nbytes: int) -> None:
    torch.set_num_threads(1)
    with socket.create_server(("127.0.0.1", 0)) as lst:
        conn.send(lst.getsockname()[1])
        sock, _ = lst.accept()
    buf = memoryview(bytearray(nbytes))
    with sock:
        while True:
            got = 0
            while got < nbytes:
                k = sock.recv_into(buf[got:], nbytes - got)
                if k == 0:
                    return
                got += k
            sock.sendall(b"k")


def _ps_server(conn, n: int, secret: bytes) -> None:
    torch.set_num_threads(1)
    ps = ParameterServer(lambda s: SGD(), model(n))
    # default options: a client that asks for the payload MAC gets it on its connection
    with TcpTransport().serve(ps, secret=secret) as endpoint:
        conn.send((endpoint.address, ps.num_shards))
        conn.recv()  # until the parent is done


def measure(n: int, reps: int) -> dict:
    ctx = mp.get_context("spawn")
    secret = new_secret()
    raw_conn, raw_child = ctx.Pipe()
    ps_conn, ps_child = ctx.Pipe()
    procs = [
        ctx.Process(target=_raw_server, args=(raw_child, 4 * n)),
        ctx.Process(target=_ps_server, args=(ps_child, n, secret)),
    ]
    for p in procs:
        p.start()
    try:
        raw = socket.create_connection(("127.0.0.1", raw_conn.recv()), timeout=60)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = memoryview(bytearray(4 * n))
        address, shards = ps_conn.recv()
        grads = [torch.full_like(t, 0.5) for t in model(n)]
        out = [torch.empty_like(t) for t in grads]  # a worker reuses its centre buffers
        clients = {
            "default": TcpTransport().connect(address, secret, worker_id=0),
            "payload MAC": TcpTransport(TcpOptions(mac_payload=True)).connect(address, secret, worker_id=1),
        }
        times: dict[str, list[float]] = {"raw": [], **{k: [] for k in clients}}
        versions = {k: c.pull(out=out).versions for k, c in clients.items()}
        for rep in range(reps + 1):  # rep 0 = warm-up (buffers, page faults)
            t0 = time.perf_counter()
            raw.sendall(data)
            raw.recv(1)
            times["raw"].append(time.perf_counter() - t0)
            for name, client in clients.items():
                t0 = time.perf_counter()
                client.push(rep, versions[name], grads)
                versions[name] = client.pull(out=out).versions
                times[name].append(time.perf_counter() - t0)
        for c in clients.values():
            c.close()
        raw.close()
    finally:
        ps_conn.send("stop")
        for p in procs:
            p.join(60)
            if p.exitcode != 0:
                print(f"warning: helper process {p.name} exited with {p.exitcode}")
    gbps = {"raw": 4 * n / statistics.median(times["raw"][1:]) / 1e9}
    gbps.update({k: 2 * 4 * n / statistics.median(v[1:]) / 1e9 for k, v in times.items() if k != "raw"})
    return {"params": n, "shards": shards, **gbps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e6,1e7,1e8", help="parameter counts, comma separated")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (>= 3) after one warm-up")
    args = ap.parse_args()
    rows = [measure(int(float(s)), max(3, args.reps)) for s in args.sizes.split(",")]
    print(
        f"median of {max(3, args.reps)} reps; GB/s of float32 parameters moved (push+pull = 2 x model bytes; raw: one way)"
    )
    print(
        f"{'params':>11} {'shards':>6} {'raw TCP':>8} {'sparkdp':>8} {'ratio':>6} {'+payload MAC':>13} {'ratio':>6}"
    )
    for r in rows:
        d, m = r["default"], r["payload MAC"]
        print(
            f"{r['params']:>11,} {r['shards']:>6} {r['raw']:>8.2f} {d:>8.2f} {d / r['raw']:>6.2f} {m:>13.2f} {m / r['raw']:>6.2f}"
        )


if __name__ == "__main__":
    main()
