"""``sparkdp plan``: which strategy wins on a given cluster, predicted by the cost model.

Without ``--calibrate`` it is arithmetic on what you state (parameters, step compute,
bandwidth, latency); with it, sparkdp measures those terms on your Spark cluster first
(``driver/calibrate.py``) and, with ``--verify``, trains each strategy briefly and reports
how far the predictions were from the measured step times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from ..errors import ConfigError

#: the link between one host's workers when neither given nor measured: shared memory or loopback
LOCAL_GBIT_PER_S, LOCAL_LATENCY_MS = 40.0, 0.01


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="predict each strategy's step time and scaling up to many workers",
        description="Predict per-step time, throughput and scaling efficiency of allreduce (plain and bf16), "
        "average(k), diloco(H, compression), asgd and the sharded fsdp, zero1 and hsdp for growing "
        "worker counts (the cost model of docs/algorithms.md §8 and §10), say whose model state fits "
        "--memory-per-worker, and recommend one that fits.",
        epilog="examples:\n"
        "  sparkdp plan --model cnn --step-compute-ms 70 --workers 1024 --bandwidth 10 --latency 0.05\n"
        "  sparkdp plan --model cnn --calibrate --verify --workers 256\n"
        "  sparkdp plan --params 1300000000 --step-compute-ms 900 --workers 64 --memory-per-worker 16GiB",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_argument_group("the workload")
    what.add_argument("--model", help="a built-in model (its parameter count; what --calibrate measures)")
    what.add_argument("--params", type=int, help="parameter count (instead of --model)")
    what.add_argument(
        "--step-compute-ms", type=float, help="one worker's forward+backward+step time on its batch"
    )
    what.add_argument("--batch", type=int, default=64, help="rows per worker per step (default 64)")
    what.add_argument(
        "--cpu-slots",
        type=int,
        help="cores all workers share (one machine); default: each worker has its own",
    )
    what.add_argument(
        "--optimizer-states",
        type=int,
        default=2,
        help="optimizer tensors the size of the parameters (AdamW, Adam: 2; SGD with momentum: 1; "
        "plain SGD: 0; default 2)",
    )
    net = p.add_argument_group("the cluster")
    net.add_argument("--workers", type=int, default=64, help="largest worker count to predict (default 64)")
    net.add_argument("--bandwidth", type=float, default=10.0, help="link bandwidth in Gbit/s (default 10)")
    net.add_argument("--latency", type=float, default=0.05, help="one message's latency in ms (default 0.05)")
    net.add_argument(
        "--memory-per-worker",
        help="model state one worker may hold, e.g. 2GiB or 1.5GB: the strategies whose parameters, "
        "gradients and optimizer state exceed it are marked and never recommended (activations are "
        "not in the cost model: leave room for them)",
    )
    net.add_argument(
        "--workers-per-host",
        type=int,
        help="also predict hsdp (sharded within a host, replicated across hosts) with this many "
        "workers per host",
    )
    net.add_argument(
        "--local-bandwidth",
        type=float,
        help="with --workers-per-host: the link between one host's workers (shared memory or "
        f"loopback) in Gbit/s (default: measured by --calibrate, else {LOCAL_GBIT_PER_S:g})",
    )
    net.add_argument(
        "--local-latency",
        type=float,
        help="with --workers-per-host: one message's latency between one host's workers in ms "
        f"(default: measured by --calibrate, else {LOCAL_LATENCY_MS:g})",
    )
    opts = p.add_argument_group("strategy options")
    opts.add_argument("--average-k", type=int, default=8, help="average's period in steps (default 8)")
    opts.add_argument("--diloco-period", type=int, default=32, help="diloco's period H in steps (default 32)")
    opts.add_argument(
        "--diloco-compression",
        default="int8",
        choices=("none", "bf16", "fp16", "int8"),
        help="how diloco's deltas travel (default int8)",
    )
    opts.add_argument("--ps-k", type=int, default=1, help="asgd's push_every (default 1)")
    opts.add_argument(
        "--shards",
        type=int,
        default=1,
        help="also predict asgd with this many server tasks on the executors, each on its own "
        "link (the strategy option servers=K; default 1: the server on the driver only)",
    )
    opts.add_argument(
        "--overlap",
        type=float,
        default=0.0,
        help="fraction of the all-reduce hidden behind backward (default 0: none)",
    )
    cal = p.add_argument_group("measuring instead of assuming")
    cal.add_argument(
        "--calibrate",
        action="store_true",
        help="measure step compute, all-reduce, the sharded strategies' all-gather and reduce-scatter "
        "(on FSDP's process group) and parameter-server terms on the cluster (--model); without it the "
        "all-gathers and reduce-scatters are priced as rings, half an all-reduce each",
    )
    cal.add_argument(
        "--verify",
        action="store_true",
        help="with --calibrate: train each strategy briefly and report the prediction error",
    )
    cal.add_argument(
        "--verify-rows",
        type=int,
        default=12_000,
        help="Fashion-MNIST rows --verify trains on, two epochs per strategy (default 12000; "
        "fewer on slow links)",
    )
    cal.add_argument("--master", help="Spark master for --calibrate (default: local[*] or SPARKDP_MASTER)")
    cal.add_argument(
        "--calibration-workers", type=int, help="tasks to calibrate with (default: all task slots)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _params(args) -> int:
    if args.params is not None:
        if args.params < 1:
            raise ConfigError(f"--params must be positive; got {args.params}")
        return args.params
    if not args.model:
        raise ConfigError("give --model NAME (a built-in model) or --params COUNT")
    from ..models import build_model

    return sum(p.numel() for p in build_model(args.model).parameters())


def run(args) -> int:
    from .. import costmodel

    if args.verify and not args.calibrate:
        raise ConfigError("--verify compares predictions with measured runs; it needs --calibrate")
    if args.verify_rows < 1:
        raise ConfigError(f"--verify-rows must be positive; got {args.verify_rows}")
    params = _params(args)
    if args.optimizer_states < 0:
        raise ConfigError(f"--optimizer-states must be >= 0; got {args.optimizer_states}")
    if args.workers_per_host is not None and args.workers_per_host < 1:
        raise ConfigError(f"--workers-per-host must be >= 1; got {args.workers_per_host}")
    memory = None if args.memory_per_worker is None else costmodel.parse_size(args.memory_per_worker)
    net = costmodel.Network.from_link(args.bandwidth, args.latency)
    report: dict = {}
    if args.calibrate:
        net, compute_s, report = _calibrated(args)
    elif args.step_compute_ms is None or args.step_compute_ms <= 0:
        raise ConfigError("give --step-compute-ms (> 0), or --calibrate to measure it on your cluster")
    else:
        compute_s = args.step_compute_ms / 1e3
    net = _local_link(args, net)
    work = costmodel.Workload(
        params,
        compute_s,
        batch=args.batch,
        cpu_slots=args.cpu_slots,
        optimizer_states=args.optimizer_states,
        memory_per_worker=memory,
    )
    rows = costmodel.table(
        work,
        net,
        costmodel.worker_counts(args.workers),
        average_k=args.average_k,
        ps_k=args.ps_k,
        shards=args.shards,
        overlap=args.overlap,
        diloco_h=args.diloco_period,
        diloco_compression=args.diloco_compression,
        per_host=args.workers_per_host,
    )
    advice = costmodel.recommend(rows, args.workers)
    if args.verify:
        report["verify"] = _verify(args, rows, report["calibration"]["workers"])
    if args.json:
        print(
            json.dumps(
                {
                    "params": params,
                    "step_compute_s": compute_s,
                    "memory_per_worker": memory,
                    "activations": "not counted (the cost model has no activation term)",
                    "network": net.__dict__,
                    "predictions": [{**r.__dict__, "label": r.label} for r in rows],
                    "recommendation": advice,
                    **report,
                },
                indent=2,
                default=str,
            )
        )
        return 0
    _print(params, compute_s, net, rows, advice, report, args.workers, memory)
    return 0


def _local_link(args, net):
    """``net`` with the link between one host's workers: the one given (--local-bandwidth,
    --local-latency), else the calibration's measurement, else shared memory's defaults. A link
    given replaces a measured one whole, the local collectives' factors with it (they were
    measured against the measured link)."""
    from .. import costmodel

    given = args.local_bandwidth is not None or args.local_latency is not None
    if net.local_seconds_per_byte is not None and not given:
        return net
    local = costmodel.Network.from_link(
        LOCAL_GBIT_PER_S if args.local_bandwidth is None else args.local_bandwidth,
        LOCAL_LATENCY_MS if args.local_latency is None else args.local_latency,
    )
    return dataclasses.replace(
        net,
        local_latency_s=local.latency_s,
        local_seconds_per_byte=local.seconds_per_byte,
        local_all_gather_factor=None,
        local_reduce_scatter_factor=None,
    )


def _calibrated(args):
    import sparkdp

    from ..driver.calibrate import calibrate
    from ..models import build_model
    from ..spark.cluster import task_slots

    if not args.model:
        raise ConfigError("--calibrate measures a built-in model's step: give --model NAME")
    spark = sparkdp.session(args.master, log_level="OFF")
    workers = args.calibration_workers or task_slots(spark) or 2
    cal = calibrate(
        build_model(args.model),
        spark=spark,
        workers=workers,
        batch=args.batch,
        per_host=args.workers_per_host,
    )
    return cal.network(), cal.step_compute_s, {"calibration": cal.as_dict()}


def _verify(args, rows, workers: int) -> list[dict]:
    import sparkdp

    from ..driver.calibrate import measure_steps

    measured = measure_steps(
        args.model,
        spark=sparkdp.session(args.master, log_level="OFF"),
        workers=workers,
        batch=args.batch,
        rows=args.verify_rows,
        average_k=args.average_k,
        ps_k=args.ps_k,
        diloco_h=args.diloco_period,
        diloco_compression=args.diloco_compression,
        shards=args.shards,
        per_host=args.workers_per_host,
    )
    steps = math.ceil(args.verify_rows / (workers * args.batch))  # per epoch, as measure_steps trains
    out = []
    for row in rows:
        if row.workers == workers and row.label in measured:
            real, predicted = measured[row.label], in_epochs_of(row, steps)
            out.append(
                {
                    "strategy": row.label,
                    "workers": workers,
                    "predicted_step_s": predicted,
                    "measured_step_s": real,
                    "error": predicted / real - 1.0,
                }
            )
    return out


def in_epochs_of(row, steps: int) -> float:
    """``row``'s step time in epochs of ``steps`` steps: average and diloco also synchronise at
    every epoch's end (evaluation and checkpoints see one model), which a short epoch feels:
    ``steps // k + 1`` synchronisations instead of ``steps / k``."""
    period = row.options.get("k") if row.strategy == "average" else row.options.get("H")
    if row.strategy not in ("average", "diloco") or not period:
        return row.step_s
    per_sync = row.comm_s * period
    return row.step_s - row.comm_s + per_sync * (steps // period + 1) / steps


def _print(params, compute_s, net, rows, advice, report, workers, memory) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cal = report.get("calibration")
    source = f"measured on {cal['workers']} workers" if cal else "as given"
    console.print(
        f"{params:,} parameters ({params * 4 / 1e6:.1f} MB), step compute {compute_s * 1e3:.1f} ms; "
        f"network {source}: α {net.latency_s * 1e6:.0f} µs, {8 / net.seconds_per_byte / 1e9:.2f} Gbit/s "
        f"(parameter server: α {net.ps_alpha * 1e6:.0f} µs, {8 / net.ps_beta / 1e9:.2f} Gbit/s, its update "
        f"rule {net.server_seconds_per_byte * 4e9:.2f} ms per million parameters"
        + (
            f"; workers in step leave its link idle {net.ps_bunching:.0%} of its busy time"
            if net.ps_bunching
            else ""
        )
        + ")"
        + (
            f"; the sharded strategies' all-gather {net.all_gather_factor:.2f}x and reduce-scatter "
            f"{net.reduce_scatter_factor:.2f}x a ring's half all-reduce"
            if (net.all_gather_factor, net.reduce_scatter_factor) != (1.0, 1.0)
            else ""
        )
        + (
            f"; within a host (measured) α {net.local_latency_s * 1e6:.0f} µs, "
            f"{8 / net.local_seconds_per_byte / 1e9:.2f} Gbit/s, reduce-scatter "
            f"{net.local_reduce_scatter_factor:.2f}x its half ring; hsdp's all-reduce across hosts "
            f"{net.replica_allreduce_factor:.2f}x a ring"
            if cal and "replica_allreduce_factor" in cal and net.local_reduce_scatter_factor is not None
            else ""
        )
    )
    labels = list(dict.fromkeys(r.label for r in rows))
    table = Table(title="predicted step time (ms) / scaling efficiency")
    table.add_column("workers", justify="right")
    for label in labels:  # "asgd(k=1,shards=1)" over three lines: six columns fit 80 characters
        table.add_column(label.replace("(", "\n(").replace(",", ",\n"), justify="right")
    for m in dict.fromkeys(r.workers for r in rows):
        cells = {
            r.label: f"{r.step_s * 1e3:.1f} / {r.efficiency:.0%}"
            + (" *" if r.bound == "server" else "")
            + (" !" if r.fits is False else "")
            for r in rows
            if r.workers == m
        }
        table.add_row(str(m), *(cells[label] for label in labels))
    console.print(table)
    console.print(
        "* limited by the parameter server's link: servers=K puts K servers on the executors, each "
        "on its own link (--shards K predicts it)"
        + ("; ! its model state does not fit --memory-per-worker" if memory is not None else "")
    )
    _print_memory(console, rows, workers, memory)
    for v in report.get("verify", []):
        console.print(
            f"verify {v['strategy']} x{v['workers']}: predicted {v['predicted_step_s'] * 1e3:.1f} ms, "
            f"measured {v['measured_step_s'] * 1e3:.1f} ms ({v['error']:+.0%})"
        )
    console.print(f"recommendation: {advice}")


def _print_memory(console, rows, workers: int, memory: int | None) -> None:
    """Each strategy's model state per worker at ``workers`` workers, and whether it fits."""
    from rich.table import Table

    from ..costmodel import size_text

    limit = f"fits {size_text(memory)}" if memory is not None else "fits (no --memory-per-worker)"
    table = Table(title=f"model state per worker at {workers} workers (parameters, gradients, optimizer)")
    table.add_column("strategy")
    table.add_column("state", justify="right")
    table.add_column(limit)
    for r in rows:
        if r.workers == workers:
            fits = "-" if r.fits is None else ("yes" if r.fits else "no")
            table.add_row(r.label, size_text(r.state_bytes), fits)
    console.print(table)
    console.print("activations are not counted (the cost model has no activation term): leave room for them")
