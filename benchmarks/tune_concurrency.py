"""``sparkdp tune`` with trials at once against one at a time, and against the same trials run
one after another as separate ``sparkdp train`` jobs.

Runs the search ``sparkdp tune --dataset fashion-mnist --model cnn-small --workers 1 --epochs 1
--limit L --trials N --search 'lr=loguniform(0.001,0.3)' --metric test_accuracy --seed S`` with
``--concurrent-trials 2`` and ``1`` (each a fresh process), timing the whole command and the
moment each trial's "complete" line appears. Then it trains the ``--concurrent-trials 2``
search's trials again, one ``sparkdp train`` process per trial with that trial's lr, one after
another (what a matrix of jobs does), and reports the wall time and the time to the best
trial of each. Prints a markdown table and writes ``--out``/tune_concurrency.json.

    python benchmarks/tune_concurrency.py --trials 6 --limit 6000 --seed 7 --out out/tune
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SPARKDP = [sys.executable, "-m", "sparkdp.cli.main"]


def shared(args: argparse.Namespace) -> list[str]:
    return ["--dataset", "fashion-mnist", "--model", "cnn-small", "--workers", "1", "--epochs", "1",
            "--limit", str(args.limit), "--seed", str(args.seed)]  # fmt: skip


def timed_lines(cmd: list[str]) -> tuple[float, list[tuple[float, str]], int]:
    """Run ``cmd``; its wall seconds, each stdout line with the second it appeared, its exit code."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.stdout is not None
    lines = [(time.perf_counter() - started, line.rstrip()) for line in proc.stdout]
    code = proc.wait()
    return time.perf_counter() - started, lines, code


def tune(args: argparse.Namespace, concurrent: int, out: Path) -> dict:
    json_out = out / f"tune-k{concurrent}.json"
    cmd = [*SPARKDP, "tune", *shared(args), "--trials", str(args.trials), "--concurrent-trials", str(concurrent),
           "--search", "lr=loguniform(0.001,0.3)", "--metric", "test_accuracy", "--direction", "maximize",
           "--json-out", str(json_out)]  # fmt: skip
    wall, lines, code = timed_lines(cmd)
    if code != 0:
        raise SystemExit(f"sparkdp tune exited {code}:\n" + "\n".join(text for _, text in lines[-20:]))
    result = json.loads(json_out.read_text())
    best = result["best"]["number"]
    done = next(at for at, text in lines if text.split()[:3] == ["trial", str(best), "complete"])
    failed = sum(t["state"] == "failed" for t in result["trials"])
    return {"how": f"sparkdp tune --concurrent-trials {concurrent}", "wall_s": wall, "time_to_best_s": done,
            "best": result["best"]["value"], "failed": failed, "trials": result["trials"]}  # fmt: skip


def one_after_another(args: argparse.Namespace, trials: list[dict], out: Path) -> dict:
    elapsed, values = 0.0, []
    for trial in trials:
        summary = out / f"train-{trial['number']}.json"
        cmd = [*SPARKDP, "train", *shared(args), "--lr", repr(trial["params"]["lr"]), "--quiet",
               "--json-out", str(summary)]  # fmt: skip
        wall, lines, code = timed_lines(cmd)
        if code != 0:
            raise SystemExit(f"sparkdp train exited {code}")
        elapsed += wall
        values.append((elapsed, json.loads(summary.read_text())["test_accuracy"]))
    best = max(v for _, v in values)
    reached = next(at for at, v in values if v == best)
    return {"how": "the same trials, one sparkdp train after another", "wall_s": elapsed,
            "time_to_best_s": reached, "best": best, "failed": 0}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--limit", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default="out/tune")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    two = tune(args, 2, out)
    one = tune(args, 1, out)
    seq = one_after_another(args, two["trials"], out)
    rows = [two, one, seq]
    print(
        f"load average before: {load_before[0]:.2f}, after: {os.getloadavg()[0]:.2f}; cores: {os.cpu_count()}"
    )
    print("| how | wall s | time to best s | best test accuracy | failed trials |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['how']} | {row['wall_s']:.1f} | {row['time_to_best_s']:.1f} | {row['best']:.4f} | {row['failed']} |"
        )
    print(f"wall time ratio, 2 at once / 1 at a time: {two['wall_s'] / one['wall_s']:.2f}")
    record = {"rows": [{k: v for k, v in r.items() if k != "trials"} for r in rows],
              "load_before": load_before, "load_after": os.getloadavg(), "cores": os.cpu_count()}  # fmt: skip
    (out / "tune_concurrency.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
