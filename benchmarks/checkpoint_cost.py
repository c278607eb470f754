"""What checkpoints cost: samples/s with checkpoints vs none, and the time one save blocks training.

``--part throughput``: the same Fashion-MNIST job (built-in CNN, 2 workers on local[2], SGD lr
0.05 momentum 0.9) runs alternately with no checkpoints (``max_restarts=0``, no
``checkpoint_dir``), with the default epoch-end checkpoints, and with checkpoints every
``--every`` steps as well; the report gives each variant's median samples/s and its ratio to no
checkpoints. Target: epoch-end checkpoints cost <= 3 %.

``--part per-save`` (no Spark): the built-in CNN (3.27M parameters) with SGD momentum state,
saved alternately as a synchronous save does it (serialize, digest, write, rotate on the
training thread) and as the training loop does it (the training thread copies the state to
host memory, the background writer does the rest); the report gives the medians of the
synchronous save, of the time training is blocked, and of the background write, then trains
on while each background write runs. Target: blocked <= 20 % of a synchronous save.

    python benchmarks/checkpoint_cost.py --repeats 3 --limit 30000 --epochs 2
    python benchmarks/checkpoint_cost.py --part per-save --saves 15
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--limit", type=int, default=30000, help="training rows (default 30000)")
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn-small"])
    p.add_argument("--every", type=int, default=100, help="steps between checkpoints in the 'every' variant")
    p.add_argument("--part", choices=["throughput", "per-save", "all"], default="all")
    p.add_argument("--saves", type=int, default=15, help="saves of each kind in the per-save part")
    args = p.parse_args()
    if args.part in ("per-save", "all"):
        per_save(args.model, args.saves)
    if args.part in ("throughput", "all"):
        throughput(args)


def per_save(model_name: str, saves: int) -> None:
    """Median seconds of a synchronous save vs the time the training loop's save blocks training."""
    from sparkdp.comm import SingleProcessCollective
    from sparkdp.config import CheckpointConfig, TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.strategies import STRATEGIES
    from sparkdp.train.checkpoint import CheckpointPolicy, save_checkpoint
    from sparkdp.train.loop import FitSpec, optimizer_state_to_bytes
    from sparkdp.train.optim import optimizer_factory, resolve_loss
    from sparkdp.train.saver import Saver

    torch.manual_seed(0)
    model = build_model(model_name)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.01, momentum=0.9),
        strategy=STRATEGIES.create("allreduce"),
        train=TensorData(x, y),
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=32, memory_format="contiguous"),
    )
    collective = SingleProcessCollective()
    optimizer = spec.optimizer.build(model)
    net = spec.strategy.setup(model, optimizer, collective)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        spec.loss(net(x), y).backward()
        optimizer.step()

    step()  # the momentum buffers exist from here on
    params = sum(p.numel() for p in model.parameters())
    sync_s, blocked_s, background_s, steps_during = [], [], [], []
    with tempfile.TemporaryDirectory() as directory:
        policy = CheckpointPolicy(CheckpointConfig(directory))
        saver = Saver(policy, spec, spec.strategy, optimizer, None, collective)
        for n in range(saves):
            began = time.perf_counter()
            save_checkpoint(
                policy,
                epoch=0,
                step=2 * n + 1,
                model=spec.strategy.unwrap().state_dict(),
                optimizer=optimizer_state_to_bytes(optimizer),
                strategy_state=spec.strategy.state_dict(),
                rng=[torch.get_rng_state()],
                history=[],
                workers=1,
            )
            sync_s.append(time.perf_counter() - began)
            step()
            began = time.perf_counter()
            saver.save(0, 2 * n + 2, [])
            blocked_s.append(time.perf_counter() - began)
            steps = 0
            while saver.writer.busy:  # training goes on while the write runs
                step()
                steps += 1
            saver.close()
            background_s.append(time.perf_counter() - began)
            steps_during.append(steps)
    print(
        f"per save, {saves} of each ({model_name}, {params / 1e6:.2f}M parameters, SGD momentum, "
        f"{torch.get_num_threads()} torch threads), median and fastest:"
    )
    for label, values in (
        ("synchronous save", sync_s),
        ("training blocked", blocked_s),
        ("background write", background_s),
    ):
        ratio = (
            f"  ({statistics.median(values) / statistics.median(sync_s):.3f}x / "
            f"{min(values) / min(sync_s):.3f}x the synchronous save)"
            if values is blocked_s
            else ""
        )
        print(f"  {label}: {statistics.median(values) * 1e3:8.1f} ms / {min(values) * 1e3:8.1f} ms{ratio}")
    print(f"  training steps of 32 rows run during a background write: {statistics.median(steps_during):.0f}")


def throughput(args: argparse.Namespace) -> None:
    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=args.limit))
    spark = sparkdp.session()
    variants = {
        "none": {"max_restarts": 0},
        "epoch": {},
        f"every {args.every} steps": {"checkpoint_every": args.every},
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, options in variants.items():
            with tempfile.TemporaryDirectory() as directory:
                if name != "none":
                    options = {**options, "checkpoint_dir": directory}
                torch.manual_seed(0)
                started = time.perf_counter()
                result = sparkdp.fit(
                    build_model(args.model),
                    train,
                    eval_data=test,
                    workers=2,
                    epochs=args.epochs,
                    optimizer_options={"lr": 0.05},
                    spark=spark,
                    show_progress=False,
                    **options,
                )
            rates[name].append(result.samples_per_s)
            print(
                f"repeat {repeat + 1} {name:>16}: {result.samples_per_s:8.1f} samples/s, "
                f"{time.perf_counter() - started:6.1f} s, test accuracy {result.test_accuracy:.4f}",
                flush=True,
            )
    base = statistics.median(rates["none"])
    print(
        f"\nmedians over {args.repeats} repeats ({args.model}, {args.limit} rows, {args.epochs} epochs, 2 workers):"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"  {name:>16}: {median:8.1f} samples/s  ({median / base:.3f}x no checkpoints)")


if __name__ == "__main__":
    main()
