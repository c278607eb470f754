"""Sync vs async communication study (the Hopsworks claim), measured against the cost model.

    python benchmarks/comm_study.py [--workers 1,2,4] [--epochs 2] [--limit 4000] [--qdisc "tbf rate 4gbit burst 256kb latency 50ms"]

On the ``comm-bound`` workload (a 4.3 M-parameter MLP, 8 rows per step: 17 MB moved per
all-reduce for a few ms of compute), for ``allreduce``, ``average`` (k = 4) and ``asgd`` at
each worker count: bytes each worker sends per step and seconds per step, measured by real
Spark training — next to what ``sparkdp plan``'s cost model predicts from a calibration
(``driver/calibrate.py``) taken under the same conditions, with each configuration's error.

The synchronous strategies run with ``shared_memory=False`` so that their bytes cross the
network stack (gloo over TCP) like the parameter server's.  ``--qdisc`` shapes the loopback
interface with a Linux ``tc`` queueing discipline (root and iproute2 needed; ``netem rate 1gbit
delay 0.25ms`` where the kernel has netem, ``tbf rate ...`` otherwise) so the bandwidth term is
a link's rather than memory copies'; the qdisc is removed on exit, even on failure or Ctrl-C.
Without root, or when the kernel refuses the qdisc, the script says so and runs on plain
loopback.  Note that shaping ``lo`` limits all workers' traffic *together* (one shared link),
whereas the cost model's ring gives every worker its own link.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_info, markdown_table  # noqa: E402

DEV = "lo"


def _tc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", *args], capture_output=True, text=True)


def shape_loopback(spec: str) -> bool:
    """Add the qdisc ``spec`` on lo; False (with the reason printed) when not permitted."""
    if os.geteuid() != 0 or not shutil.which("tc"):
        print("qdisc: needs root and iproute2's tc; running on plain loopback", file=sys.stderr)
        return False
    _tc("qdisc", "del", "dev", DEV, "root")  # a qdisc a crashed earlier run left behind
    done = _tc("qdisc", "add", "dev", DEV, "root", *spec.split())
    if done.returncode != 0:
        print(f"qdisc: tc refused ({done.stderr.strip()}); running on plain loopback", file=sys.stderr)
        return False
    atexit.register(unshape_loopback)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(130))  # exit through atexit, never leaving lo shaped
    return True


def unshape_loopback() -> None:
    _tc("qdisc", "del", "dev", DEV, "root")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=4000)
    ap.add_argument(
        "--qdisc", default="", help='e.g. "tbf rate 4gbit burst 256kb latency 50ms" (empty: plain loopback)'
    )
    args = ap.parse_args()
    counts = [int(v) for v in args.workers.split(",")]

    import sparkdp
    from sparkdp import costmodel
    from sparkdp.driver import bench
    from sparkdp.driver.calibrate import calibrate

    shaped = shape_loopback(args.qdisc) if args.qdisc else False
    try:
        work = bench.workload("comm-bound")
        spark = sparkdp.session(f"local[{max(counts)}]", log_level="OFF")
        cal = calibrate(
            work.build_model(),
            spark=spark,
            workers=max(2, min(counts[-1], 2)),
            batch=work.batch,
            sample_shape=(64,),
            reps=10,
            shared_memory=False,
        )
        net = cal.network()
        # every worker shares this machine's cores: more workers than cores stretch each step
        load = costmodel.Workload(cal.params, cal.step_compute_s, batch=work.batch, cpu_slots=os.cpu_count())
        choices = {
            "allreduce": (bench.StrategyChoice("allreduce", {"shared_memory": False}), ("allreduce", {})),
            "average(k=4)": (
                bench.StrategyChoice("average", {"period": 4, "shared_memory": False}),
                ("average", {"k": 4}),
            ),
            "asgd": (bench.StrategyChoice("asgd"), ("asgd", {})),
        }
        data = work.load(args.limit, 0)
        rows = []
        for m in counts:
            for label, (choice, (model_name, options)) in choices.items():
                r = bench.run_one(work, choice, m, 0, epochs=args.epochs, data=data, spark=spark)
                steps_per_worker = args.epochs * -(-args.limit // (m * work.batch))
                measured = r["train_time_s"] / steps_per_worker
                sent = r["bytes_per_sample"] * work.batch  # bytes on the wire per worker-step
                predicted = costmodel.predict(model_name, load, net, m, **options)
                rows.append(
                    [
                        label,
                        m,
                        f"{sent / 1e6:.2f}",
                        f"{measured * 1e3:.1f}",
                        f"{predicted.step_s * 1e3:.1f}",
                        f"{predicted.step_s / measured - 1:+.0%}",
                        f"{r['test_accuracy']:.3f}",
                    ]
                )
                print(rows[-1], flush=True)
    finally:
        if shaped:
            unshape_loopback()
    print(machine_info())
    link = f"loopback shaped by tc qdisc '{args.qdisc}'" if shaped else "plain loopback (no shaping)"
    print(
        f"comm-bound: {cal.params:,} parameters, batch {work.batch}; {link}; calibration: C "
        f"{cal.step_compute_s * 1e3:.1f} ms, α {net.latency_s * 1e6:.0f} µs, {8 / net.seconds_per_byte / 1e9:.2f} "
        f"Gbit/s all-reduce; α_ps {net.ps_alpha * 1e6:.0f} µs, {8 / net.ps_beta / 1e9:.2f} Gbit/s parameter server, "
        f"its ASGD update {cal.server_apply_s * 1e3:.1f} ms per push"
    )
    print(
        markdown_table(
            [
                "strategy",
                "workers",
                "MB on the wire per worker-step",
                "measured step (ms)",
                "predicted step (ms)",
                "prediction error",
                "test accuracy",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
