"""Goodput under worker loss: ``fault_tolerance="step"`` against ``"restart"``.

The built-in CNN on Fashion-MNIST trains on ``local[W,F]`` (W workers), without failures and
with the busiest training worker's process SIGKILLed. A killer thread picks, among the Spark
Python workers this process started (the children of its JVM's Python daemon), the one that used
the most CPU in the last half second (one that trains), and kills it by its process id. Both
modes get the same ``max_restarts`` (high enough for every kill) and no checkpoint directory:
``restart`` recovers from its temporary epoch-end checkpoints, ``step`` keeps the survivors
training and heals a replacement from one of them. A warm-up fit (one epoch, not measured)
comes first, so that no measured run pays the session's cold start alone.

Kill every ``--kill-every`` seconds (the next kill that long after the last), each mode once
without and once with kills. Goodput is the useful samples per second (the job's rows times its
epochs) of the run with kills against the same mode's failure-free run. The report adds the
test accuracy, the restarts, the leaves and joins with their heal times, where each step-mode
kill's time went (kill to leave, leave to the replacement's join, the heal) and the per-epoch
training loss of both runs:

    python benchmarks/step_fault_tolerance.py --workers 4 --rows 20000 --epochs 10 --kill-every 30

Kill once (``--kill-once-at F``: F of the way through the failure-free run's time), the
failure-free and killed runs alternated (free first in odd repeats, killed first in even ones)
``--repeats`` times, step mode only: the wall ratio, accuracy and samples differences, restarts
and membership per pair and their medians, against the issue's single-kill criteria:

    python benchmarks/step_fault_tolerance.py --workers 2 --rows 30000 --epochs 2 --kill-once-at 0.5 --repeats 3

``--heal-mb 1 10 100`` only times a heal through the driver's quorum endpoint (on this machine,
in one process: the healer's state bytes relayed by the endpoint, loaded by the joiner) for
models of those sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import markdown_table  # noqa: E402


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
    """The workers forked by a Python daemon of a JVM below this process (found from this
    process down: its own session's, or a test bed's executors')."""
    tree, found, todo = _children(), [], [os.getpid()]
    while todo:
        pid = todo.pop()
        for child in tree.get(pid, []):
            try:
                cmd = Path(f"/proc/{child}/cmdline").read_bytes()
                if _is_daemon(cmd) and _is_daemon(Path(f"/proc/{pid}/cmdline").read_bytes()):
                    found.append(child)  # forked by the daemon: a Python worker
            except OSError:
                continue
            todo.append(child)
    return found


def busiest_spark_worker(window_s: float = 0.5) -> int | None:
    """The Spark Python worker that used the most CPU over ``window_s`` (at least a fifth of a
    core: one that trains), or None."""
    before = {}
    for pid in _spark_python_workers():
        try:
            before[pid] = _cpu_ticks(pid)
        except OSError:
            continue
    time.sleep(window_s)
    used = {}
    for pid, ticks in before.items():
        try:
            used[pid] = _cpu_ticks(pid) - ticks
        except OSError:
            continue
    threshold = window_s * os.sysconf("SC_CLK_TCK") / 5
    busy = [pid for pid, ticks in used.items() if ticks >= threshold]
    return max(busy, key=used.__getitem__) if busy else None


class Killer(threading.Thread):
    """SIGKILL the busiest training Spark Python worker every ``every_s`` seconds, or once
    ``at_s`` seconds after it starts (after ``ready()`` first held, when given: training began);
    while none trains (start-up, evaluation, a restart) it tries again every half second, so
    each kill hits training."""

    def __init__(
        self, every_s: float | None = None, at_s: float | None = None, ready: Callable[[], bool] | None = None
    ) -> None:
        super().__init__(name="benchmark-killer", daemon=True)
        self.every_s, self.at_s, self.ready, self.stop = every_s, at_s, ready, threading.Event()
        self.kills: list[float] = []  # time.time() of each kill

    def run(self) -> None:
        while self.ready is not None and not self.ready():
            if self.stop.wait(0.5):
                return
        due = time.monotonic() + (self.at_s if self.at_s is not None else self.every_s)
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            pid = busiest_spark_worker()
            if pid is None or self.stop.is_set():
                due = time.monotonic()
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append(time.time())
            if self.every_s is None:
                return
            due = time.monotonic() + self.every_s

    def __enter__(self) -> Killer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()


def kill_timing(kills: list[float], membership: list[dict]) -> list[dict]:
    """Where each kill's time went in step mode: from the kill to the quorum's leave record
    (detection), from the leave to the replacement's join (Spark starting the replacement task,
    its imports and its wait for the next boundary), and the heal itself. Times are
    ``time.time()``; a kill with no leave after it (it hit no member) has no figures."""
    leaves = [m for m in membership if m["kind"] == "leave"]
    joins = [m for m in membership if m["kind"] == "join"]
    out = []
    for kill in kills:
        leave = next((m for m in leaves if m["time"] >= kill), None)
        if leave is None:
            out.append({"detect_s": None, "rejoin_s": None, "heal_s": None})
            continue
        leaves.remove(leave)
        join = next((m for m in joins if m["worker"] == leave["worker"] and m["time"] >= leave["time"]), None)
        if join is not None:
            joins.remove(join)
        out.append(
            {
                "detect_s": leave["time"] - kill,
                "rejoin_s": join["time"] - leave["time"] if join else None,
                "heal_s": join.get("heal_s") if join else None,
            }
        )
    return out


_DATA: dict[int, tuple] = {}


def _data(rows: int) -> tuple:
    from sparkdp.data.datasets import dataset_tensors, load_dataset

    if rows not in _DATA:
        _DATA[rows] = dataset_tensors(load_dataset("fashion-mnist", limit=rows))
    return _DATA[rows]


def _run(args, mode: str, spark, *, epochs: int | None = None, killer: Killer | None = None) -> dict:
    import sparkdp
    from sparkdp.models import build_model

    train, test = _data(args.rows)
    epochs = epochs or args.epochs
    torch_seed(0)
    started = time.time()
    try:
        with killer or _NoKiller():
            result = sparkdp.fit(
                build_model("cnn-small"),
                train,
                eval_data=test,
                workers=args.workers,
                epochs=epochs,
                batch_size=args.batch_size,
                spark=spark,
                memory_format="contiguous",
                show_progress=False,
                fault_tolerance=mode,
                max_restarts=args.max_restarts,
            )
    except sparkdp.WorkerFailed as exc:  # more failures than max_restarts, or nothing to heal from
        return {"mode": mode, "kills": len(killer.kills) if killer else 0, "failed": str(exc).splitlines()[0],
                "wall_s": time.time() - started, "useful_samples_per_s": 0.0, "test_accuracy": None,
                "restarts": None, "membership": [], "loss_curve": [], "samples": []}  # fmt: skip
    kills = killer.kills if killer is not None else []
    membership = result.details.get("membership", [])
    return {
        "mode": mode,
        "kills": len(kills),
        "kill_at_s": [k - started for k in kills],
        "wall_s": result.wall_s,
        "train_s": result.train_time_s,
        "useful_samples_per_s": len(train.features) * epochs / result.wall_s,
        "test_accuracy": result.test_accuracy,
        "restarts": len(result.details["restarts"]),
        "restart_attempts_s": [r["attempt_s"] for r in result.details["restarts"]],
        "membership": [{**m, "at_s": m["time"] - started} for m in membership],
        "kill_timing": kill_timing(kills, membership),
        "loss_curve": [h["loss"] for h in result.history],
        "samples": [h["samples"] for h in result.history],
    }


class _NoKiller:
    kills: list[float] = []

    def __enter__(self) -> _NoKiller:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def heal_time(megabytes: float, host: str = "127.0.0.1", place: Callable | None = None) -> dict:
    """A joiner healed from a live peer through the driver's quorum endpoint (on ``host``):
    a model of ``megabytes`` of float32 parameters with SGD momentum (the state is twice that),
    from the healer's state bytes to the joiner's model and optimizer loaded. ``place(role,
    make)`` builds the endpoint ("server"), the healer's and the joiner's clients where they
    belong (default: here; ``benchmarks/multihost.py --heal-mb``: on hosts of the test bed)."""
    place = place or (lambda role, make: make())
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
    server = place("server", lambda: QuorumServer(quorum, host))
    with server, ThreadPoolExecutor(2) as pool:
        healer, joiner = (
            place(role, lambda w=w: QuorumClient(server.info, w, wait_s=60.0))
            for role, w in (("healer", 0), ("joiner", 1))
        )
        list(pool.map(lambda c: c.boundary(0, None), (healer, joiner)))
        joiner.abandon()  # worker 1 lost; it comes back as a joiner
        healer.boundary(0, True)
        joiner = place("joiner", lambda: QuorumClient(server.info, 1, wait_s=60.0))
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


def _seconds(values: list, digits: int = 2) -> str:
    shown = [f"{v:.{digits}f}" for v in values if v is not None]
    return ", ".join(shown) if shown else "-"


def goodput_report(runs: list[dict]) -> str:
    """Each mode's failure-free and killed runs: goodput, accuracy, restarts, joins and heals,
    where the step-mode kills' time went, and the per-epoch losses side by side."""
    rows, curves = [], []
    for free, killed in zip(runs[::2], runs[1::2]):
        joins = [m for m in killed["membership"] if m["kind"] == "join"]
        leaves = [m for m in killed["membership"] if m["kind"] == "leave"]
        timing = killed.get("kill_timing", [])
        rows.append(
            [
                killed["mode"],
                killed["kills"],
                f"{free['wall_s']:.1f} / {killed['wall_s']:.1f}",
                f"{killed['useful_samples_per_s'] / free['useful_samples_per_s']:.2f}",
                f"{free['test_accuracy']:.4f} / "
                + ("failed" if killed["test_accuracy"] is None else f"{killed['test_accuracy']:.4f}"),
                killed["restarts"],
                f"{len(leaves)} / {len(joins)}",
                _seconds([t["detect_s"] for t in timing], 1),
                _seconds([t["rejoin_s"] for t in timing], 1),
                _seconds([m.get("heal_s") for m in joins]),
            ]
        )
        for epoch, (a, b) in enumerate(zip(free["loss_curve"], killed["loss_curve"] or [None] * 99), 1):
            curves.append([killed["mode"], epoch, f"{a:.4f}", "-" if b is None else f"{b:.4f}"])
    table = markdown_table(
        ["mode", "kills", "wall s free / killed", "goodput", "test acc. free / killed", "restarts",
         "leaves / joins", "kill to leave s", "leave to join s", "heal s"],
        rows,
    )  # fmt: skip
    return table + "\n\n" + markdown_table(["mode", "epoch", "loss free", "loss killed"], curves)


def kill_once(args, spark) -> list[dict]:
    """Failure-free and once-killed step-mode runs, alternated, after a warm-up; the kill
    ``--kill-once-at`` of the way through the failure-free runs' median wall so far."""
    reference = _run(args, "step", spark)["wall_s"]  # warm-up: cold start, not measured
    pairs = []
    for repeat in range(args.repeats):
        pair = {}
        for killed in (False, True) if repeat % 2 == 0 else (True, False):
            killer = Killer(at_s=args.kill_once_at * reference) if killed else None
            pair["killed" if killed else "free"] = run = _run(args, "step", spark, killer=killer)
            print(json.dumps({"killed": killed, **run}), flush=True)
            if not killed:
                frees = [p["free"]["wall_s"] for p in pairs] + [run["wall_s"]]
                reference = statistics.median(frees)
        pairs.append(pair)
    return pairs


def kill_once_report(pairs: list[dict], batch_size: int) -> str:
    rows, ratios, differences = [], [], []
    for n, pair in enumerate(pairs, 1):
        free, killed = pair["free"], pair["killed"]
        ratio = killed["wall_s"] / free["wall_s"]
        points = (
            None
            if killed["test_accuracy"] is None
            else 100 * (killed["test_accuracy"] - free["test_accuracy"])
        )
        samples = max((abs(a - b) for a, b in zip(free["samples"], killed["samples"])), default=None)
        kinds = "-".join(m["kind"] for m in killed["membership"]) or "none"
        ratios.append(ratio)
        differences.append(points)
        rows.append(
            [
                n,
                "free first" if n % 2 else "killed first",
                f"{free['wall_s']:.1f} / {killed['wall_s']:.1f}",
                f"{ratio:.3f}",
                _seconds(killed.get("kill_at_s", []), 1),
                "-" if points is None else f"{points:+.2f}",
                samples,
                killed["restarts"],
                kinds,
                _seconds([t["detect_s"] for t in killed.get("kill_timing", [])], 1),
                _seconds([t["rejoin_s"] for t in killed.get("kill_timing", [])], 1),
            ]
        )
    table = markdown_table(
        ["pair", "order", "wall s free / killed", "killed / free", "kill at s", "acc. points", "max samples diff",
         "restarts", "membership", "kill to leave s", "leave to join s"],
        rows,
    )  # fmt: skip
    walls = [statistics.median(p[k]["wall_s"] for p in pairs) for k in ("free", "killed")]
    valid = [d for d in differences if d is not None]
    summary = (
        f"median wall free {walls[0]:.1f} s, killed {walls[1]:.1f} s: ratio of medians "
        f"{walls[1] / walls[0]:.3f}, median of pair ratios {statistics.median(ratios):.3f} (target <= 1.25); "
        f"median accuracy difference {statistics.median(valid) if valid else float('nan'):+.2f} points "
        f"(target within 1.5); samples per epoch within {batch_size} rows of the failure-free run's "
        "in every pair: " + str(all(r[6] is not None and r[6] <= batch_size for r in rows))
    )
    return table + "\n\n" + summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills")
    parser.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="with --kill-every: instead of --epochs, as many epochs as take about S s at the warm-up's pace",
    )
    parser.add_argument(
        "--kill-once-at",
        type=float,
        metavar="F",
        help="kill once, F (0..1) of the way through the failure-free run, alternated with failure-free runs",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="failure-free/killed pairs with --kill-once-at"
    )
    parser.add_argument("--max-restarts", type=int, default=20)
    parser.add_argument("--modes", nargs="+", default=["step", "restart"], choices=["step", "restart"])
    parser.add_argument("--json-out", help="write the runs here as JSON")
    parser.add_argument(
        "--heal-mb",
        type=float,
        nargs="*",
        help="only time a heal of models of these sizes (MB of parameters)",
    )
    args = parser.parse_args()
    if args.kill_once_at is not None and not 0 < args.kill_once_at < 1:
        parser.error(f"--kill-once-at is a fraction of the run between 0 and 1; got {args.kill_once_at}")
    if args.heal_mb:
        for megabytes in args.heal_mb:
            print(json.dumps(heal_time(megabytes)), flush=True)
        return

    import sparkdp

    spark = sparkdp.session(f"local[{args.workers},8]", app_name="sparkdp-step-ft-bench")
    print(f"load average before: {os.getloadavg()}", flush=True)
    try:
        if args.kill_once_at is not None:
            runs: list = kill_once(args, spark)
            report = kill_once_report(runs, args.batch_size)
        else:
            warm = _run(
                args, "step", spark, epochs=1
            )  # warm-up: the Python workers and imports, not measured
            if args.duration:  # as many epochs as fill --duration at the warm-up's training pace
                args.epochs = max(1, round(args.duration / warm["train_s"]))
                print(f"--duration {args.duration:g}: {args.epochs} epochs", flush=True)
            runs = []
            for mode in args.modes:
                for kill in (False, True):
                    killer = Killer(every_s=args.kill_every) if kill else None
                    runs.append(_run(args, mode, spark, killer=killer))
                    print(json.dumps({k: v for k, v in runs[-1].items() if k != "membership"}), flush=True)
            report = goodput_report(runs)
    finally:
        spark.stop()
    print(f"load average after: {os.getloadavg()}")
    print()
    print(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
