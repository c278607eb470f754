"""``sparkdp tune`` with trials at once against one at a time, and against the same trials run
one after another as separate ``sparkdp train`` jobs.

Runs the search ``sparkdp tune --dataset fashion-mnist --model cnn-small --workers 1 --epochs 1
--limit L --trials N --search 'lr=loguniform(0.001,0.3)' --metric test_accuracy --seed S`` with
``--concurrent-trials 2`` and ``1`` (each a fresh process), timing the whole command and the
moment each trial's "complete" line appears. Then it trains the ``--concurrent-trials 2``
search's trials again, one ``sparkdp train`` process per trial with that trial's lr, one after
another (what a matrix of jobs does), and reports the wall time and the time to the best
trial of each. Prints a markdown table and writes ``--out``/tune_concurrency.json.

Where a trial's time goes: while each search runs, the machine's CPU use (psutil, every
``--sample-s``) is sampled and reported as its median and the share of samples under half the
cores; each trial's seconds are split into waiting for its slots (``wall_s - job_s``), its job's
start, data and evaluation (``job_s - train_s``) and its training loops (``train_s``), as
medians over the trials. ``--repeats R`` runs the pair of searches R times (alternating) and
reports the medians; ``--no-sequence`` leaves out the separate jobs.

    python benchmarks/tune_concurrency.py --trials 6 --limit 6000 --seed 7 --out out/tune
    python benchmarks/tune_concurrency.py --repeats 3 --no-sequence
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

SPARKDP = [sys.executable, "-m", "sparkdp.cli.main"]


def shared(args: argparse.Namespace) -> list[str]:
    return ["--dataset", "fashion-mnist", "--model", "cnn-small", "--workers", "1", "--epochs", "1",
            "--limit", str(args.limit), "--seed", str(args.seed)]  # fmt: skip


class CpuSampler:
    """The machine's CPU use (percent of all cores) every ``every_s`` while it runs."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.samples = every_s, []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        psutil.cpu_percent(None)
        while not self._done.wait(self.every_s):
            self.samples.append(psutil.cpu_percent(None))

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def figures(self) -> dict:
        if not self.samples:
            return {}
        return {"cpu_median_pct": statistics.median(self.samples),
                "cpu_mean_pct": statistics.fmean(self.samples),
                "cpu_under_half_frac": sum(v < 50 for v in self.samples) / len(self.samples)}  # fmt: skip


def timed_lines(cmd: list[str], sample_s: float = 0.5) -> tuple[float, list[tuple[float, str]], int, dict]:
    """Run ``cmd``; its wall seconds, each stdout line with the second it appeared, its exit
    code, and the machine's CPU use meanwhile."""
    started = time.perf_counter()
    with CpuSampler(sample_s) as cpu:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        assert proc.stdout is not None
        lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stdout]
        code = proc.wait()
    return time.perf_counter() - started, lines, code, cpu.figures()


def phases(trials: list[dict]) -> dict:
    """Median seconds per trial: waiting for slots, the job outside training, training."""
    ran = [t for t in trials if t.get("job_s") is not None]
    if not ran:
        return {}
    return {"trial_s": statistics.median(t["wall_s"] for t in ran),
            "slot_wait_s": statistics.median(t["wall_s"] - t["job_s"] for t in ran),
            "job_outside_training_s": statistics.median(t["job_s"] - t["train_s"] for t in ran),
            "train_s": statistics.median(t["train_s"] for t in ran)}  # fmt: skip


def tune(args: argparse.Namespace, concurrent: int, out: Path) -> dict:
    json_out = out / f"tune-k{concurrent}.json"
    cmd = [*SPARKDP, "tune", *shared(args), "--trials", str(args.trials), "--concurrent-trials", str(concurrent),
           "--search", "lr=loguniform(0.001,0.3)", "--metric", "test_accuracy", "--direction", "maximize",
           "--json-out", str(json_out)]  # fmt: skip
    wall, lines, code, cpu = timed_lines(cmd, args.sample_s)
    if code != 0:
        raise SystemExit(f"sparkdp tune exited {code}:\n" + "\n".join(text for _, text in lines[-20:]))
    result = json.loads(json_out.read_text())
    best = result["best"]["number"]
    done = next(at for at, text in lines if text.split()[:3] == ["trial", str(best), "complete"])
    # before the first trial's line: the interpreter, the JVM and Spark session, the data (both
    # searches pay it once, so it bounds what running trials at once can save)
    startup = next(at for at, text in lines if text.startswith("trial "))
    failed = sum(t["state"] == "failed" for t in result["trials"])
    return {"how": f"sparkdp tune --concurrent-trials {concurrent}", "wall_s": wall, "time_to_best_s": done,
            "startup_s": startup, "trials_s": wall - startup,
            "best": result["best"]["value"], "failed": failed, "trials": result["trials"],
            **cpu, **phases(result["trials"])}  # fmt: skip


def one_after_another(args: argparse.Namespace, trials: list[dict], out: Path) -> dict:
    elapsed, values = 0.0, []
    for trial in trials:
        summary = out / f"train-{trial['number']}.json"
        cmd = [*SPARKDP, "train", *shared(args), "--lr", repr(trial["params"]["lr"]), "--quiet",
               "--json-out", str(summary)]  # fmt: skip
        wall, lines, code, _cpu = timed_lines(cmd, args.sample_s)
        if code != 0:
            raise SystemExit(f"sparkdp train exited {code}")
        elapsed += wall
        values.append((elapsed, json.loads(summary.read_text())["test_accuracy"]))
    best = max(v for _, v in values)
    reached = next(at for at, v in values if v == best)
    return {"how": "the same trials, one sparkdp train after another", "wall_s": elapsed,
            "time_to_best_s": reached, "best": best, "failed": 0}  # fmt: skip


def medians(runs: list[dict]) -> dict:
    """One row of the medians of repeated runs of the same search."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "failed"]
    return {"how": runs[0]["how"], "repeats": len(runs), "failed": sum(r["failed"] for r in runs),
            **{k: statistics.median(r[k] for r in runs) for k in keys}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--limit", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--no-sequence", action="store_true", help="leave out the separate train jobs")
    parser.add_argument("--out", default="out/tune")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    twos, ones = [], []
    for repeat in range(args.repeats):
        order = (2, 1) if repeat % 2 == 0 else (1, 2)
        for k in order:
            (twos if k == 2 else ones).append(tune(args, k, out))
            last = (twos if k == 2 else ones)[-1]
            print(f"repeat {repeat + 1} k={k}: {last['wall_s']:.1f} s, cpu median {last.get('cpu_median_pct', 0):.0f} %",
                  flush=True)  # fmt: skip
    two, one = medians(twos), medians(ones)
    rows = [two, one]
    if not args.no_sequence:
        rows.append(one_after_another(args, twos[0]["trials"], out))
    print(
        f"load average before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}"
    )
    print(
        "| how | wall s | time to best s | best test accuracy | failed trials | CPU median % | samples under 50 % |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        cpu = (f"{row['cpu_median_pct']:.0f} | {100 * row['cpu_under_half_frac']:.0f} %"
               if "cpu_median_pct" in row else " | ")  # fmt: skip
        print(
            f"| {row['how']} | {row['wall_s']:.1f} | {row['time_to_best_s']:.1f} | {row['best']:.4f} | {row['failed']} | {cpu} |"
        )
    print(
        "| how | start-up s | trials s | trial s | waiting for slots s | job outside training s | training s |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in (two, one):
        if "trial_s" in row:
            print(f"| {row['how']} | {row['startup_s']:.1f} | {row['trials_s']:.1f} | {row['trial_s']:.2f} | "
                  f"{row['slot_wait_s']:.2f} | {row['job_outside_training_s']:.2f} | {row['train_s']:.2f} |")  # fmt: skip
    # the trials at twice the pace at best: the start-up stays
    bound = (one["startup_s"] + one["trials_s"] / 2) / one["wall_s"]
    print(f"wall time ratio if the trials alone ran twice as fast: {bound:.2f}")
    paired = [a["wall_s"] / b["wall_s"] for a, b in zip(twos, ones)]
    print(
        f"wall time ratio, 2 at once / 1 at a time: median of the repeats' {statistics.median(paired):.2f} "
        f"(each: {', '.join(f'{r:.2f}' for r in paired)}); of the median walls {two['wall_s'] / one['wall_s']:.2f}"
    )
    record = {"rows": rows, "runs": {"2": [{k: v for k, v in r.items() if k != "trials"} for r in twos],
                                      "1": [{k: v for k, v in r.items() if k != "trials"} for r in ones]},
              "load_before": load_before, "load_after": os.getloadavg(), "cores": os.cpu_count()}  # fmt: skip
    (out / "tune_concurrency.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
