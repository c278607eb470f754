"""Bring up a Spark standalone cluster spread over network-namespace "hosts" on this machine, for
trying sparkdp across hosts by hand (needs root; see tests/multihost/netbed.py for the layout).

    python scripts/multihost_cluster.py --workers 2 --rate 100mbit --slow worker-1=10mbit
    python scripts/multihost_cluster.py --workers 2 --rate 1gbit -- \\
        python -m sparkdp.cli.main train --dataset fashion-mnist --model cnn --workers 2 \\
        --limit 4000 --master {master_url}

With a command after ``--``, it runs on the driver host (``{master_url}`` replaced) and the
cluster is torn down when it ends; without one, the cluster stays up, the script prints how to run
commands on its hosts, and Ctrl-C (or SIGTERM) tears it down: processes, namespaces, links.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multihost import netbed  # noqa: E402 - after the path is set


def main() -> int:
    argv = sys.argv[1:]
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per Spark Worker")
    parser.add_argument("--memory", default="2g", help="memory per Spark Worker")
    parser.add_argument(
        "--rate", default="1gbit", help="every host's link, each way (tc units); 'none': unshaped"
    )
    parser.add_argument(
        "--slow", action="append", default=[], metavar="HOST=RATE", help="one host's own rate"
    )
    parser.add_argument("--burst", default=None, help="tbf bucket (default: rate/250, at least 32kb)")
    parser.add_argument("--latency", default="50ms", help="tbf queue bound")
    parser.add_argument(
        "--hostname-loopback",
        action="store_true",
        help="each host's own name resolves to 127.0.1.1 on it (many distributions' default)",
    )
    args = parser.parse_args(argv)
    reason = netbed.unavailable()
    if reason:
        print(f"multihost_cluster: {reason}", file=sys.stderr)
        return 2
    netbed.install_signal_teardown()
    netbed.remove_stale()
    rates = dict(item.split("=", 1) for item in args.slow)
    hosts = netbed.cluster_hosts(args.workers)
    bed = netbed.NetBed(
        hosts,
        rate=None if args.rate == "none" else args.rate,
        rates=rates,
        burst=args.burst,
        latency=args.latency,
        hostname_loopback=args.hostname_loopback,
    )
    try:
        bed.up()
        cluster = netbed.SparkOnNetBed(bed, hosts[2:], cores=args.cores, memory=args.memory).start()
        if command:
            proc = bed.run(
                "driver",
                [c.replace("{master_url}", cluster.master_url) for c in command],
                env=cluster.env(),
                timeout=24 * 3600,
            )
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            return proc.returncode
        print(f"master: {cluster.master_url}  (logs: {bed.directory / 'logs'})")
        for host in hosts:
            print(f"  {host:10s} {bed.address(host):14s} link {bed.host_rate(host) or 'unshaped'}")
        env = " ".join(
            f"{k}={shlex.quote(v)}"
            for k, v in cluster.env().items()
            if k in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
        )
        print(
            "run a command on the driver host:\n  env "
            + env
            + " "
            + shlex.join(bed.command("driver", ["bash"]))
        )
        print("Ctrl-C tears everything down.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 130
    finally:
        bed.down()


if __name__ == "__main__":
    sys.exit(main())
