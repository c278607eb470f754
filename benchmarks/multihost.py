"""Strategies across real per-host links on the multi-host test bed: throughput, bytes and time to accuracy.

The test bed (``tests/multihost/netbed.py``) puts the driver, a Spark Master and each Worker in a
network namespace of its own (own hostname, /etc/hosts and /dev/shm), joined by a bridge; every
host's link is limited by ``tbf`` both ways to ``--rates`` (1 Gbit/s and 100 Mbit/s by default).
Each configuration runs ``sparkdp train --dataset fashion-mnist --model cnn`` on the driver host
(``--limit`` rows, ``--epochs`` epochs, SGD lr 0.05, batch 64, one core per worker, ``--seeds``) and
reports samples/s over the training time, the last epoch's time and test accuracy, the training
seconds until the test accuracy first reached ``--target`` (evaluated after every epoch; empty
when it never did), and the bytes that crossed the links (the tbf counters of the driver's and
the workers' links, both directions summed), also per trained sample. Needs root.

    python benchmarks/multihost.py --workers 2 --rates 1gbit 100mbit --limit 4000
    python benchmarks/multihost.py --strategies allreduce allreduce+bf16 allreduce+powersgd average-8 \
        diloco-32 diloco-32+int8 --limit 12000 --epochs 3 --target 0.8 --seeds 0 1

``asgd+2servers`` and ``asgd+4servers`` run asgd with that many parameter-server tasks on the
executors (``servers=K``); the bed then has K more executor hosts, so that each server has a link
of its own, and the other configurations run on it too.

    python benchmarks/multihost.py --workers 2 4 --rates 100mbit --strategies asgd asgd+2servers

``--per-host N`` runs N workers on each Worker host (N cores each, sharing the host's link and
its ``/dev/shm``), so that ``hsdp`` shards within a host and replicates across hosts; ``fsdp``
and ``zero1`` run on either layout.

    python benchmarks/multihost.py --workers 4 --per-host 2 --rates 100mbit --strategies fsdp hsdp

``--slow HOST=RATE`` gives one host a slower link (e.g. ``worker-1=10mbit``); each run then also
records what the live monitoring diagnosed (its warnings and every worker's data/compute/
communication split, from the run log). ``--plan`` runs ``sparkdp plan --model cnn --calibrate
--verify`` on the driver host instead of training: the cost model's error per strategy.

    python benchmarks/multihost.py --strategies allreduce asgd --rates 100mbit --slow worker-1=10mbit
    python benchmarks/multihost.py --plan --rates 1gbit 100mbit --limit 2560

``--task lm`` trains a language model instead: ``sparkdp train --dataset fortunes --model gpt``
at the size of the language-model guide (2 layers of width 128, a 2,048-token vocabulary,
128-token blocks: 0.68 M parameters), AdamW lr 3e-3 with a 20-step warm-up and cosine decay,
8 blocks per worker per step, ``--limit`` cookies. It reports tokens/s, the validation loss after
every epoch, the training seconds until it first fell to ``--target`` (a loss: lower is better)
and the bytes that crossed the links per trained token.

    python benchmarks/multihost.py --task lm --strategies allreduce average-8 diloco-32 \
        --limit 3000 --epochs 3 --target 6.0

``--kill-every S`` measures goodput under worker loss instead: for each ``--fault-tolerance``
mode, allreduce once without failures and once with the busiest executor's Python worker
SIGKILLed every S seconds (``step_fault_tolerance.Killer``, from this process down to the Worker
hosts' executors), ``--max-restarts`` and no checkpoint directory (with ``--restart-checkpoints``,
restart mode's epoch-end checkpoints in the bed's directory, which every host sees). It reports each mode's
goodput (the failure-free run's fit time against the killed run's, from the run log), restarts,
leaves and joins, where each step-mode kill's time went and both runs' per-epoch losses.
``--heal-mb`` times a heal across the bed instead: the quorum endpoint on the driver host, the
healer on worker-0 and the joiner on worker-1, the state crossing both hosts' links.

    python benchmarks/multihost.py --workers 4 --rates 1gbit --limit 20000 --epochs 10 \
        --kill-every 30 --fault-tolerance step restart
    python benchmarks/multihost.py --rates 1gbit --heal-mb 1 10 100 300

Writes a markdown table to stdout and everything to ``--json``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import markdown_table, write_json  # noqa: E402
from step_fault_tolerance import Killer, goodput_report, heal_time, kill_timing  # noqa: E402
from tests.multihost import netbed  # noqa: E402 - after the path is set

T = TypeVar("T")
CLONE_NEWNET = 0x40000000  # <sched.h>: setns() into a network namespace


def _options(strategy: str, **options: object) -> list[str]:
    flags = ["--strategy", strategy]
    for key, value in options.items():
        flags += ["--strategy-option", f"{key}={value}"]
    return flags


STRATEGIES = {
    "allreduce": _options("allreduce"),
    "allreduce+bf16": _options("allreduce", compression="bf16"),
    "allreduce+powersgd": _options("allreduce", compression="powersgd"),
    "average-8": _options("average", period=8),
    "average-8+int8": _options("average", period=8, compression="int8"),
    "diloco-32": _options("diloco", period=32),
    "diloco-32+int8": _options("diloco", period=32, compression="int8"),
    "asgd": _options("asgd"),
    "asgd+2servers": _options("asgd", servers=2),
    "asgd+4servers": _options("asgd", servers=4),
    "fsdp": _options("fsdp"),
    "hsdp": _options("hsdp"),
    "zero1": _options("zero1"),
}
#: the server tasks a configuration runs on the executors (each gets a host of its own)
SERVERS = {"asgd+2servers": 2, "asgd+4servers": 4}
DEFAULT = ["allreduce", "average-8", "asgd"]

#: what each task trains: ``sparkdp train`` flags, the metric its target is on and which way is better
TASKS = {
    "cnn": {
        "flags": "--dataset fashion-mnist --model cnn --lr 0.05".split(),
        "metric": "test_accuracy",
        "higher_is_better": True,
        "tokens_per_sample": None,
    },
    "lm": {
        "flags": (
            "--dataset fortunes --model gpt --model-option n_layer=2 --model-option n_head=4 "
            "--model-option d_model=128 --model-option vocab_size=2048 --model-option block_size=128 "
            "--optimizer adamw --lr 0.003 --lr-schedule warmup-cosine --warmup-steps 20 --batch-size 8"
        ).split(),
        "metric": "test_loss",
        "higher_is_better": False,
        "tokens_per_sample": 128,  # the block size above: one sample is one block
    },
}


def train(
    cluster: netbed.SparkOnNetBed,
    label: str,
    workers: int,
    seed: int,
    args,
    out: Path,
    extra: list[str] | None = None,
    killer: Killer | None = None,
) -> dict:
    """One ``sparkdp train`` run on the driver host (with ``extra`` flags; ``killer`` running
    beside it)."""
    run_dir = out.with_suffix("")
    cmd = [
        sys.executable,
        "-m",
        "sparkdp.cli.main",
        "train",
        *TASKS[args.task]["flags"],
        *STRATEGIES[label],
        "--workers",
        str(workers),
        "--epochs",
        str(args.epochs),
        "--limit",
        str(args.limit),
        "--seed",
        str(seed),
        "--master",
        cluster.master_url,
        "--quiet",
        "--json-out",
        str(out),
        "--out",
        str(run_dir),
        *(extra or []),
    ]
    before = {h: cluster.bed.qdisc_stats(h) for h in cluster.bed.hosts}
    started = time.monotonic()
    if killer is not None:
        killer.start()
    try:
        proc = cluster.run_driver(cmd, timeout=args.timeout)
    finally:
        if killer is not None:
            killer.stop.set()
            killer.join()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {
            "error": proc.stderr.strip().splitlines()[-1]
            if proc.stderr.strip()
            else f"exit {proc.returncode}"
        }
    after = {h: cluster.bed.qdisc_stats(h) for h in cluster.bed.hosts}
    moved = {h: sum(after[h][k] - before[h][k] for k in ("sent", "received")) for h in cluster.bed.hosts}
    summary = json.loads(out.read_text())
    history = summary.get("history") or [{}]
    executors = {h: v for h, v in moved.items() if h.startswith(("worker-", "server-"))}
    workers_bytes = sum(executors.values())
    task = TASKS[args.task]
    metric, per_token = task["metric"], task["tokens_per_sample"]
    # the cnn's --limit is its rows; the corpus's is cookies, so count the blocks trained
    samples = sum(e.get("samples") or 0 for e in history) if per_token else args.limit * args.epochs
    return {
        "samples_per_s": summary["samples_per_s"],
        "tokens_per_s": summary["samples_per_s"] * per_token if per_token else None,
        "epoch_s": history[-1].get("epoch_time_s"),
        metric: history[-1].get(metric),
        "wall_s": wall,
        "time_to_target_s": time_to_target(history, args.target, metric, task["higher_is_better"]),
        "metric_by_epoch": [[e.get("epoch_time_s"), e.get(metric)] for e in history],
        "bytes_per_sample": workers_bytes / max(samples, 1),
        "bytes_per_token": workers_bytes / max(samples * per_token, 1) if per_token else None,
        "driver_link_mb": moved["driver"] / 1e6,
        "worker_link_mb": workers_bytes / len(executors) / 1e6,
        "busiest_link_mb": max(moved.values()) / 1e6,
        "summary": summary,
        "fit_s": fit_seconds(run_dir / "run.jsonl"),
        **diagnosis(run_dir / "run.jsonl"),
    }


def fit_seconds(run_log: Path) -> float | None:
    """The fit's seconds by the run log: from its header to its summary record."""
    times = {}
    for line in run_log.read_text().splitlines() if run_log.exists() else []:
        record = json.loads(line)
        if record.get("type") in ("header", "summary"):
            times[record["type"]] = record["time"]
    return times["summary"] - times["header"] if len(times) == 2 else None


def trained(run_log: Path) -> bool:
    """Whether the run log shows trained rows yet (a ``job`` record with samples): the kills'
    clock starts there, not in the driver's or the executors' start-up."""
    if not run_log.exists():
        return False
    return any(
        '"type": "job"' in line and json.loads(line).get("samples")
        for line in run_log.read_text().splitlines()
        if line.endswith("}")
    )


def fault_runs(cluster: netbed.SparkOnNetBed, workers: int, args, directory: Path) -> list[dict]:
    """Each ``--fault-tolerance`` mode without failures, then with a worker killed every
    ``--kill-every`` seconds: rows for ``step_fault_tolerance.goodput_report``."""
    runs = []
    for mode in args.fault_tolerance:
        for kill in (False, True):
            out = directory / f"{mode}-{'killed' if kill else 'free'}.json"
            log = out.with_suffix("") / "run.jsonl"
            killer = Killer(every_s=args.kill_every, ready=lambda log=log: trained(log)) if kill else None
            flags = ["--fault-tolerance", mode, "--max-restarts", str(args.max_restarts)]
            if mode == "restart" and args.restart_checkpoints:  # the bed's directory: every host sees it
                flags += ["--checkpoint-dir", str(directory / f"checkpoints-{'killed' if kill else 'free'}")]
            started = time.time()
            row = train(cluster, "allreduce", workers, args.seeds[0], args, out, flags, killer)
            kills = killer.kills if killer is not None else []
            if "error" in row:
                runs.append({"mode": mode, "kills": len(kills), "failed": row["error"], "wall_s": 0.0,
                             "useful_samples_per_s": 0.0, "test_accuracy": None, "restarts": None,
                             "membership": [], "loss_curve": [], "samples": []})  # fmt: skip
            else:
                summary = row.pop("summary")
                membership = summary.get("membership", [])
                seconds = row["fit_s"] or summary["wall_s"]
                runs.append(
                    {
                        **row,
                        "mode": mode,
                        "kills": len(kills),
                        "kill_at_s": [k - started for k in kills],
                        "wall_s": seconds,
                        "useful_samples_per_s": args.limit * args.epochs / seconds,
                        "restarts": len(summary.get("restarts", [])),
                        "membership": [{**m, "at_s": m["time"] - started} for m in membership],
                        "kill_timing": kill_timing(kills, membership),
                        "loss_curve": [h["loss"] for h in summary["history"]],
                        "samples": [h["samples"] for h in summary["history"]],
                    }
                )
            shown = {k: v for k, v in runs[-1].items() if k not in ("membership", "split", "metric_by_epoch")}
            print(json.dumps({"workers": workers, **shown}), file=sys.stderr, flush=True)
    return runs


def diagnosis(run_log: Path) -> dict:
    """What the live monitoring said during a run: its warnings, and each worker's last
    data/compute/communication split (fractions of its time over the whole run)."""
    warnings, last = [], {}
    for line in run_log.read_text().splitlines() if run_log.exists() else []:
        record = json.loads(line)
        if record.get("type") == "warning":
            warnings.append(record["message"])
        elif record.get("type") == "metrics":
            last[record["rank"]] = record
    split = {}
    for rank, r in sorted(last.items()):
        spent = sum(r.get(k, 0.0) for k in ("data_s", "compute_s", "comm_s")) or 1.0
        split[rank] = {k[:-2]: round(r.get(k, 0.0) / spent, 3) for k in ("data_s", "compute_s", "comm_s")}
        split[rank]["steps"] = r.get("steps")
    return {"warnings": warnings, "split": split}


def plan(cluster: netbed.SparkOnNetBed, workers: int, args, out: Path, servers: int) -> list[dict]:
    """``sparkdp plan --calibrate --verify`` on the driver host: predicted and measured step per strategy
    (asgd also with ``servers`` server tasks on hosts of their own, when the bed has them; hsdp
    with ``--per-host`` workers per host)."""
    cmd = [
        sys.executable,
        "-m",
        "sparkdp.cli.main",
        "plan",
        "--model",
        "cnn",
        "--calibrate",
        "--verify",
        "--workers",
        str(workers),
        "--calibration-workers",
        str(workers),
        "--verify-rows",
        str(args.limit),
        "--master",
        cluster.master_url,
        "--json",
        *(["--shards", str(servers)] if servers > 1 else []),
        *(["--workers-per-host", str(args.per_host)] if args.per_host > 1 else []),
    ]
    proc = cluster.run_driver(cmd, timeout=args.timeout)
    if proc.returncode != 0:
        return [
            {
                "error": proc.stderr.strip().splitlines()[-1]
                if proc.stderr.strip()
                else f"exit {proc.returncode}"
            }
        ]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    out.write_text(json.dumps(report, indent=2))
    return [{**v, "calibration": report["calibration"]} for v in report["verify"]]


def in_namespace(netns: str, make: Callable[[], T]) -> T:
    """``make()`` run on a thread that entered the network namespace ``netns`` first, so the
    sockets it opens (and the threads it starts) live there."""

    def entered() -> T:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/run/netns/{netns}") as handle:
            if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
        return make()

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: this one stays where it was
        return pool.submit(entered).result()


def bed_heals(args) -> None:
    """``step_fault_tolerance.heal_time`` across the bed: the quorum endpoint on the driver host,
    the healer on worker-0, the joiner on worker-1 (the state crosses two links, relayed)."""
    hosts = {"server": "driver", "healer": "worker-0", "joiner": "worker-1"}
    rows = []
    for rate in args.rates:
        with netbed.NetBed(list(hosts.values()), rate=rate) as bed:
            for megabytes in args.heal_mb:
                row = heal_time(
                    megabytes,
                    bed.address("driver"),
                    lambda role, make, bed=bed: in_namespace(bed.netns(hosts[role]), make),
                )
                rows.append({"rate": rate, **row})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        markdown_table(
            ["link per host", "parameters MB", "state MB", "heal s"],
            [[r["rate"], r["model_mb"], r["state_bytes"] / 1e6, r["heal_s"]] for r in rows],
        )
    )
    write_json(args.json, {"args": vars(args), "results": rows})


def check_layout(args) -> None:
    """Every worker count fills whole hosts of ``--per-host``; parameter-server tasks keep hosts
    of one core (with several cores a host could take training tasks and servers alike)."""
    if args.per_host < 1:
        raise SystemExit(f"--per-host must be >= 1; got {args.per_host}")
    uneven = [w for w in args.workers if w % args.per_host]
    if uneven:
        raise SystemExit(
            f"--workers {' '.join(map(str, uneven))} do not fill hosts of --per-host {args.per_host}: "
            "give worker counts that are multiples of it"
        )
    if args.per_host > 1 and any(s in SERVERS for s in args.strategies):
        raise SystemExit(
            f"--per-host {args.per_host} gives every Worker host that many cores, so Spark could place "
            f"training tasks on the server hosts: run {', '.join(SERVERS)} with --per-host 1"
        )


def time_to_target(
    history: list[dict], target: float | None, metric: str = "test_accuracy", higher_is_better: bool = True
) -> float | None:
    """Training seconds until the first epoch whose ``metric`` reached ``target`` (at or above it
    for an accuracy, at or below it for a loss)."""
    spent = 0.0
    for epoch in history:
        spent += epoch.get("epoch_time_s") or 0.0
        value = epoch.get(metric)
        if target is None or value is None:
            continue
        if (value >= target) if higher_is_better else (value <= target):
            return spent
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument(
        "--per-host",
        type=int,
        default=1,
        help="workers per Worker host, each with a core of its own (default 1; hsdp shards within a host)",
    )
    parser.add_argument("--rates", nargs="+", default=["1gbit", "100mbit"])
    parser.add_argument("--strategies", nargs="+", default=DEFAULT, choices=list(STRATEGIES))
    parser.add_argument(
        "--task", choices=list(TASKS), default="cnn", help="cnn: Fashion-MNIST; lm: a GPT on fortunes"
    )
    parser.add_argument(
        "--limit", type=int, default=4000, help="training rows, or cookies with --task lm (default 4000)"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs, each evaluated (default 1)")
    parser.add_argument(
        "--target", type=float, help="test accuracy (cnn, e.g. 0.8) or validation loss (lm, e.g. 6.0) to time"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--timeout", type=float, default=400, help="seconds per training run")
    parser.add_argument("--slow", metavar="HOST=RATE", help="one host's slower link, e.g. worker-1=10mbit")
    parser.add_argument("--plan", action="store_true", help="run sparkdp plan --calibrate --verify instead")
    parser.add_argument(
        "--kill-every", type=float, metavar="S", help="goodput with a worker killed every S seconds instead"
    )
    parser.add_argument(
        "--fault-tolerance",
        nargs="+",
        default=["step", "restart"],
        choices=["step", "restart"],
        help="the modes --kill-every compares (default both)",
    )
    parser.add_argument("--max-restarts", type=int, default=20, help="with --kill-every (default 20)")
    parser.add_argument(
        "--restart-checkpoints",
        action="store_true",
        help="with --kill-every: restart mode checkpoints to a directory every host sees (without one, a "
        "job on a cluster has nothing to restart from)",
    )
    parser.add_argument(
        "--heal-mb", type=float, nargs="+", help="only time heals of models of these sizes across the bed"
    )
    parser.add_argument("--json", default=str(ROOT / "out" / "bench-multihost.json"))
    args = parser.parse_args()
    slow = dict([args.slow.split("=", 1)]) if args.slow else {}
    check_layout(args)
    reason = netbed.unavailable()
    if reason:
        raise SystemExit(f"benchmarks/multihost.py: {reason}")
    netbed.install_signal_teardown()
    netbed.remove_stale()
    if args.heal_mb:
        bed_heals(args)
        return
    results = []
    for workers in args.workers:
        for rate in args.rates:
            servers = max((SERVERS.get(s, 0) for s in args.strategies), default=0)
            hosts = netbed.cluster_hosts(workers // args.per_host, servers)
            with netbed.NetBed(hosts, rate=rate, rates=slow) as bed:
                cluster = netbed.SparkOnNetBed(
                    bed, hosts[2:], cores=args.per_host, memory=f"{2 * args.per_host}g"
                ).start()
                if args.plan:
                    for row in plan(cluster, workers, args, bed.directory / "plan.json", servers):
                        results.append({"workers": workers, "rate": rate, **row})
                        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
                    continue
                if args.kill_every:
                    runs = fault_runs(cluster, workers, args, bed.directory)
                    results += [{"workers": workers, "rate": rate, **r} for r in runs]
                    print(f"\n{workers} workers, {rate} links, a kill every {args.kill_every:g} s:\n")
                    print(goodput_report(runs))
                    continue
                for seed in args.seeds:
                    for label in args.strategies:
                        row = {
                            "workers": workers,
                            "rate": rate,
                            "strategy": label,
                            "seed": seed,
                            **train(
                                cluster, label, workers, seed, args, bed.directory / f"{label}-{seed}.json"
                            ),
                        }
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        results.append(row)
    if args.kill_every:
        write_json(args.json, {"args": vars(args), "results": results})
        return
    if args.plan:
        print(
            markdown_table(
                ["workers", "link per host", "strategy", "predicted ms", "measured ms", "error"],
                [
                    [
                        r["workers"],
                        r["rate"],
                        r.get("strategy", r.get("error")),
                        1e3 * r.get("predicted_step_s", 0),
                        1e3 * r.get("measured_step_s", 0),
                        f"{100 * r['error']:+.0f} %" if isinstance(r.get("error"), float) else None,
                    ]
                    for r in results
                ],
                digits=1,
            )
        )
        write_json(args.json, {"args": vars(args), "results": results})
        return
    lm = args.task == "lm"
    metric = TASKS[args.task]["metric"]
    headers = [
        "workers",
        "link per host",
        "strategy",
        "seed",
        "tokens/s" if lm else "samples/s",
        "last epoch s",
        "val. loss" if lm else "test acc.",
        f"s to {args.target}" if args.target else "s to target",
        "bytes/token" if lm else "bytes/sample",
        "MB per executor link",
        "MB driver link",
        "MB busiest link",
    ]
    rows = [
        [
            r["workers"],
            r["rate"],
            r["strategy"],
            r["seed"],
            r.get("tokens_per_s" if lm else "samples_per_s", r.get("error")),
            r.get("epoch_s"),
            f"{r[metric]:.3f}" if r.get(metric) is not None else None,
            r.get("time_to_target_s"),
            r.get("bytes_per_token" if lm else "bytes_per_sample"),
            r.get("worker_link_mb"),
            r.get("driver_link_mb"),
            r.get("busiest_link_mb"),
        ]
        for r in results
    ]
    print(markdown_table(headers, rows, digits=1))
    print()
    print(summary_table(results, args.target, lm))
    write_json(args.json, {"args": vars(args), "results": results})


def summary_table(results: list[dict], target: float | None, lm: bool = False) -> str:
    """Medians over the seeds per (workers, rate, strategy), and each against allreduce's: how
    much sooner the target came, and the last epoch's test accuracy difference in points (cnn)
    or validation loss difference (lm)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if "error" not in r:
            groups.setdefault((r["workers"], r["rate"], r["strategy"]), []).append(r)

    def median(rows: list[dict], key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if len(values) == len(rows) and values else None

    metric = "test_loss" if lm else "test_accuracy"
    rows = []
    for (workers, rate, strategy), runs in groups.items():
        base = groups.get((workers, rate, "allreduce"))
        reach, base_reach = median(runs, "time_to_target_s"), base and median(base, "time_to_target_s")
        value, base_value = median(runs, metric), base and median(base, metric)
        if value is None:
            difference = None
        elif lm:
            difference = f"{value - base_value:+.3f}" if base_value is not None else None
        else:
            difference = f"{100 * (value - base_value):+.1f}" if base_value is not None else None
        rows.append(
            [
                workers,
                rate,
                strategy,
                len(runs),
                median(runs, "tokens_per_s" if lm else "samples_per_s"),
                reach,
                f"{base_reach / reach:.1f}x" if reach and base_reach else None,
                f"{value:.3f}" if value is not None else None,
                difference,
                median(runs, "bytes_per_token" if lm else "bytes_per_sample"),
            ]
        )
    headers = [
        "workers",
        "link per host",
        "strategy",
        "seeds",
        "tokens/s" if lm else "samples/s",
        f"s to {target}",
        "sooner than allreduce",
        "val. loss" if lm else "test acc.",
        "vs allreduce" if lm else "points vs allreduce",
        "bytes/token" if lm else "bytes/sample",
    ]
    return markdown_table(headers, rows, digits=1)


if __name__ == "__main__":
    main()
