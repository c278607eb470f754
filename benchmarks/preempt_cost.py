"""What the preemption agreement costs: steps/s with and without it, side by side in one invocation.

Two gloo worker processes on this machine train the same model (allreduce, SGD) for the same
steps, in the same two processes, alternately with the training loop's preemption watch (a one-int-per-rank SUM
all-reduce started at every step boundary and read at the next, train/preempt.py) and without
it (the loop called with no watch). The smaller the step, the larger the agreement's share:
``mlp`` (a 784-256-10 MLP, 64 rows a step) is the worst case the built-in models offer; the
report gives each variant's median steps/s, their ratio, and the median of the ratios of the
runs made back to back; and, for every run with the watch, how many agreements it started and
the time the training thread spent in the watch (the direct cost, which a busy machine's noise
in steps/s can hide or exaggerate).

    python benchmarks/preempt_cost.py --model mlp --repeats 5 --epochs 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    from sparkdp.comm.torch_dist import TorchCollective
    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.models import build_model
    from sparkdp.monitor.probe import NoProbe
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train import loop, preempt
    from sparkdp.train.optim import optimizer_factory, resolve_loss
    from sparkdp.train.preempt import watch_preemption
    from sparkdp.train.trainer import Trainer

    torch.set_num_threads(1)
    if args.agree_every_s is not None:
        preempt.AGREE_EVERY_S = args.agree_every_s
    coll = TorchCollective().setup(
        master_addr="127.0.0.1", master_port=port, rank=rank, world_size=2, timeout_s=60
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(args.rows, 1, 28, 28, generator=g), torch.randint(0, 10, (args.rows,), generator=g)
    lines = []
    for repeat in range(args.repeats):
        # alternated, in turn first (ABBA), so that the machine's drift and any first-run effect touch both alike
        for watched in (False, True) if repeat % 2 == 0 else (True, False):
            torch.manual_seed(0)
            model = build_model(args.model)
            spec = loop.FitSpec(
                model=model,
                loss=resolve_loss("cross_entropy"),
                optimizer=optimizer_factory("sgd", model, lr=0.01, momentum=0.9),
                strategy=resolve_strategy("allreduce", shared_memory=False),
                train=TensorData(x, y),
                eval=None,
                training=TrainingConfig(epochs=args.epochs, batch_size=64, memory_format="contiguous"),
            )
            inside = [0.0, 0]  # seconds the training thread spent in the watch, agreements started
            with watch_preemption(coll) if watched else contextlib.nullcontext() as watch:
                if watch is not None:
                    boundary, start = watch.step_boundary, watch._start

                    def timed(boundary=boundary, inside=inside):  # noqa: ANN202
                        began = time.perf_counter()
                        try:
                            return boundary()
                        finally:
                            inside[0] += time.perf_counter() - began

                    def counted(start=start, inside=inside):  # noqa: ANN202
                        inside[1] += 1
                        start()

                    watch.step_boundary, watch._start = timed, counted
                report = Trainer(spec, coll, NoProbe(), watch).fit()
            if report is not None and watch is not None:
                steps = args.epochs * (spec.steps_per_epoch(2) or 0)
                print(
                    f"  {inside[1]} agreements in {steps} steps; the training thread spent "
                    f"{1e3 * inside[0]:.1f} ms in the watch = {100 * inside[0] / report.train_time_s:.2f} % "
                    "of the training time",
                    flush=True,
                )
            if report is not None:
                rate = args.epochs * (spec.steps_per_epoch(2) or 0) / report.train_time_s
                lines.append(f"{repeat} {int(watched)} {rate}")
                print(
                    f"repeat {repeat + 1} {'with' if watched else 'without':>7} the agreement: {rate:8.1f} steps/s",
                    flush=True,
                )
    if rank == 0:
        with open(out, "w") as f:
            f.write("\n".join(lines))
    coll.teardown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "linear", "cnn-small", "cnn"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--agree-every-s", type=float, default=None, help="seconds between agreements (0: every step)"
    )
    p.add_argument("--rows", type=int, default=12800, help="random 28x28 rows (default 12800)")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "rates")
        mp.start_processes(_worker, args=(port, args, out), nprocs=2, start_method="spawn")
        with open(out) as f:
            rows = [line.split() for line in f.read().splitlines()]
    rates = {w: [float(r) for _, v, r in rows if int(v) == w] for w in (0, 1)}
    base, watched = statistics.median(rates[0]), statistics.median(rates[1])
    # each repeat's pair ran back to back: their ratio is the least touched by the machine's drift
    paired = statistics.median(b / a for a, b in zip(rates[0], rates[1], strict=True))
    print(
        f"{args.model}: median {base:.1f} steps/s without, {watched:.1f} with the agreement "
        f"(ratio {watched / base:.3f}); median of the {len(rates[0])} paired ratios {paired:.3f}"
    )


if __name__ == "__main__":
    main()
