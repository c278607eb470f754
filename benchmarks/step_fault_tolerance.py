"""Goodput under repeated worker loss: ``fault_tolerance="step"`` against ``"restart"``.

The built-in CNN on Fashion-MNIST trains on ``local[W,F]`` (W workers), once without failures
and once with a training worker's process SIGKILLed every ``--kill-every`` seconds, in each mode.
A killer thread picks, among the Spark Python workers this process started (the children of
its JVM's Python daemon), one that used CPU in the last half second (one that trains), and
kills it by its process id. Both modes get the same ``max_restarts`` (high enough for every
kill) and no checkpoint directory: ``restart`` recovers from its temporary epoch-end
checkpoints, ``step`` keeps the survivors training and heals a replacement from one of them.

Goodput is the useful samples per second (the job's rows times its epochs) of the run with
kills against the same mode's failure-free run. The report adds the test accuracy, the
restarts and the leaves and joins (with the heal times and bytes) of each run.

    python benchmarks/step_fault_tolerance.py --workers 2 --rows 30000 --epochs 2 --kill-every 6

``--heal-mb 1 10 100`` only times a heal through the driver's quorum endpoint (on this machine,
in one process: the healer's state bytes relayed by the endpoint, loaded by the joiner) for
models of those sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(parent, []).append(int(entry))
    return tree


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _is_daemon(cmdline: bytes) -> bool:
    """Spark's Python worker daemon: sparkdp's (its sessions') or PySpark's own."""
    return b"sparkdp.spark.daemon" in cmdline or b"pyspark.daemon" in cmdline


def _spark_python_workers() -> list[int]:
    """The workers forked by this process's JVM's Python daemon (found from this process down)."""
    tree, found, todo = _children(), [], [os.getpid()]
    while todo:
        pid = todo.pop()
        for child in tree.get(pid, []):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if _is_daemon(cmd) and _is_daemon(Path(f"/proc/{pid}/cmdline").read_bytes()):
                found.append(child)  # forked by the daemon: a Python worker
            todo.append(child)
    return found


class Killer(threading.Thread):
    """SIGKILL a training Spark Python worker every ``every_s`` seconds until stopped."""

    def __init__(self, every_s: float) -> None:
        super().__init__(name="benchmark-killer", daemon=True)
        self.every_s, self.stop, self.kills = every_s, threading.Event(), []

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                before = {pid: _cpu_ticks(pid) for pid in _spark_python_workers()}
                time.sleep(0.5)
                busy = [pid for pid, ticks in before.items() if _cpu_ticks(pid) - ticks >= 10]
            except OSError:
                continue
            if busy:
                os.kill(busy[0], signal.SIGKILL)
                self.kills.append(time.time())


def _run(args: argparse.Namespace, mode: str, kill: bool, spark) -> dict:
    import sparkdp
    from sparkdp.data.datasets import dataset_tensors, load_dataset
    from sparkdp.models import build_model

    train, test = dataset_tensors(load_dataset("fashion-mnist", limit=args.rows))
    torch_seed(0)
    killer = Killer(args.kill_every) if kill else None
    if killer is not None:
        killer.start()
    started = time.perf_counter()
    try:
        result = sparkdp.fit(
            build_model("cnn-small"),
            train,
            eval_data=test,
            workers=args.workers,
            epochs=args.epochs,
            batch_size=args.batch_size,
            spark=spark,
            memory_format="contiguous",
            show_progress=False,
            fault_tolerance=mode,
            max_restarts=args.max_restarts,
        )
    except sparkdp.WorkerFailed as exc:  # more failures than max_restarts, or nothing to heal from
        return {"mode": mode, "kills": len(killer.kills) if killer else 0, "failed": str(exc).splitlines()[0],
                "wall_s": time.perf_counter() - started, "useful_samples_per_s": 0.0, "test_accuracy": None,
                "restarts": None, "membership": [], "loss_curve": []}  # fmt: skip
    finally:
        if killer is not None:
            killer.stop.set()
            killer.join()
    useful = len(train.features) * args.epochs
    return {
        "mode": mode,
        "kills": len(killer.kills) if killer is not None else 0,
        "wall_s": result.wall_s,
        "useful_samples_per_s": useful / result.wall_s,
        "test_accuracy": result.test_accuracy,
        "restarts": len(result.details["restarts"]),
        "membership": result.details.get("membership", []),
        "loss_curve": [h["loss"] for h in result.history],
    }


def heal_time(megabytes: float) -> dict:
    """A joiner healed from a live peer through the driver's quorum endpoint (on this machine):
    a model of ``megabytes`` of float32 parameters with SGD momentum (the state is twice that),
    from the healer's state bytes to the joiner's model and optimizer loaded."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from sparkdp import state as state_io
    from sparkdp.driver.quorum import Quorum
    from sparkdp.driver.quorum_server import QuorumServer
    from sparkdp.train.quorum_client import QuorumClient
    from sparkdp.train.quorum_messages import JOINING

    side = int((megabytes * 2**20 / 4) ** 0.5)
    healer_model, joiner_model = torch.nn.Linear(side, side), torch.nn.Linear(side, side)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (healer_model, joiner_model)]
    healer_model(torch.ones(1, side)).sum().backward()
    optimizers[0].step()
    quorum = Quorum(2, 10)
    with QuorumServer(quorum, "127.0.0.1") as server, ThreadPoolExecutor(2) as pool:
        healer, joiner = (QuorumClient(server.info, w, wait_s=60.0) for w in (0, 1))
        list(pool.map(lambda c: c.boundary(0, None), (healer, joiner)))
        joiner.abandon()  # worker 1 lost; it comes back as a joiner
        healer.boundary(0, True)
        joiner = QuorumClient(server.info, 1, wait_s=60.0)
        joined = pool.submit(joiner.boundary, JOINING, None)
        while 1 not in quorum.arrived:
            time.sleep(0.001)
        started = time.perf_counter()
        decision, _ = healer.boundary(0, True)
        payload = state_io.to_bytes(
            {"model": healer_model.state_dict(), "optimizer": optimizers[0].state_dict()}
        )
        healer.heal(decision.heal_to, payload)
        _, data = joined.result(120)
        state = state_io.from_bytes(data)
        joiner_model.load_state_dict(state["model"])
        optimizers[1].load_state_dict(state["optimizer"])
        seconds = time.perf_counter() - started
        for client in (healer, joiner):
            client.close()
    return {"model_mb": megabytes, "state_bytes": len(payload), "heal_s": seconds}


def torch_seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills")
    parser.add_argument("--max-restarts", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=["step", "restart"])
    parser.add_argument("--json-out", help="write the runs here as JSON")
    parser.add_argument(
        "--heal-mb",
        type=float,
        nargs="*",
        help="only time a heal of models of these sizes (MB of parameters)",
    )
    args = parser.parse_args()
    if args.heal_mb:
        for megabytes in args.heal_mb:
            print(json.dumps(heal_time(megabytes)), flush=True)
        return

    import sparkdp

    spark = sparkdp.session(f"local[{args.workers},8]", app_name="sparkdp-step-ft-bench")
    runs = []
    try:
        _run(args, "step", False, spark)  # warm-up: the Python workers and imports, not measured
        for mode in args.modes:
            for kill in (False, True):
                runs.append(_run(args, mode, kill, spark))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "membership"}), flush=True)
    finally:
        spark.stop()
    print("\n| mode | kills | wall (s) free / killed | goodput | accuracy free / killed | restarts | joins |")
    print("|---|---|---|---|---|---|---|")
    for free, killed in zip(runs[::2], runs[1::2]):
        joins = [m for m in killed["membership"] if m["kind"] == "join"]
        heal = ", ".join(f"{m['heal_s']:.2f} s" for m in joins if m.get("heal_s") is not None)
        accuracy = "failed" if killed["test_accuracy"] is None else f"{killed['test_accuracy']:.4f}"
        print(
            f"| {free['mode']} | {killed['kills']} | {free['wall_s']:.1f} / {killed['wall_s']:.1f} "
            f"| {killed['useful_samples_per_s'] / free['useful_samples_per_s']:.2f} "
            f"| {free['test_accuracy']:.4f} / {accuracy} | {killed['restarts']} "
            f"| {len(joins)} ({heal or 'none'}) |"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
