"""Helpers shared by the benchmark scripts in ``benchmarks/``.

Import from a script in this folder with::

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import markdown_table, median, run_child, ...

Nothing here imports torch or pyspark at module level, so a parent process that only
launches and times children stays light (:func:`run_torch_distributor` imports them when a
child calls it).
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

RESULT_MARKER = "BENCH_RESULT_JSON "


# --------------------------------------------------------------------------- numbers


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None/NaN; None when there are none."""
    vals = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: None -> '-', floats with ``digits`` decimals, thousands separators for big ones."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def pass_fail(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


# --------------------------------------------------------------------------- tables / output


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 2) -> str:
    """A GitHub-flavoured markdown table (cells formatted with :func:`fmt`), columns padded."""
    cells = [[fmt(c, digits) for c in row] for row in rows]
    widths = [
        max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)
    ]

    def line(items: Sequence[str]) -> str:
        return "| " + " | ".join(str(x).ljust(w) for x, w in zip(items, widths, strict=True)) + " |"

    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def write_json(path: str, payload: Any) -> None:
    """Write ``payload`` as indented JSON, atomically (temp file + rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def emit_result(payload: dict) -> None:
    """In a child process: print the one JSON line the parent collects (see :func:`parse_result`)."""
    sys.stdout.flush()
    print(RESULT_MARKER + json.dumps(payload, default=str), flush=True)


def parse_result(text: str) -> dict | None:
    """The last :func:`emit_result` line in a child's output, or None."""
    for line in reversed(text.splitlines()):
        idx = line.find(RESULT_MARKER)
        if idx >= 0:
            try:
                return json.loads(line[idx + len(RESULT_MARKER) :])
            except json.JSONDecodeError:
                return None
    return None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        info["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------- memory


def self_peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


class TreeRssSampler:
    """Samples the summed RSS of a process and all its descendants (JVM, Python workers,
    torchrun children ...) every ``interval_s`` in a thread; ``peak_mb`` is the largest sum
    seen. Needs psutil; without it ``peak_mb`` stays None."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        try:
            import psutil
        except ImportError:
            return
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            total = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            mb = total / (1024 * 1024)
            if self.peak_mb is None or mb > self.peak_mb:
                self.peak_mb = mb
            self._stop.wait(self.interval_s)


# --------------------------------------------------------------------------- children


@dataclass
class ChildRun:
    """How one child process went: exit code, wall seconds measured around it, its output."""

    cmd: list[str]
    returncode: int | None
    wall_s: float
    output: str
    timed_out: bool = False
    peak_tree_rss_mb: float | None = None
    result: dict | None = field(default=None)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.result is not None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output.splitlines()[-lines:])


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (it was started in its own session), so a JVM
    or torchrun grandchild does not outlive a timed-out child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(
    cmd: list[str],
    *,
    timeout_s: float,
    env: dict[str, str] | None = None,
    log_path: str | None = None,
    echo: bool = False,
    sample_rss: bool = True,
) -> ChildRun:
    """Run ``cmd`` in its own process group, time it (wall clock around the whole process),
    kill the group after ``timeout_s``, and collect its :func:`emit_result` JSON line.

    stdout and stderr are merged; they go to ``log_path`` when given (and to our stderr
    when ``echo``)."""
    out_chunks: list[str] = []
    log_fh = open(log_path, "w", encoding="utf-8") if log_path else None  # noqa: SIM115
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        text=True,
        errors="replace",
        bufsize=1,
    )

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out_chunks.append(line)
            if log_fh:
                log_fh.write(line)
                log_fh.flush()
            if echo and not line.startswith(RESULT_MARKER):
                sys.stderr.write("    | " + line)
                sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    sampler = TreeRssSampler(proc.pid) if sample_rss else None
    try:
        if sampler:
            sampler.__enter__()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    finally:
        if sampler:
            sampler.__exit__(None, None, None)
    wall = time.perf_counter() - started
    # The child may have left grandchildren (e.g. a JVM) holding the pipe open.
    reader.join(timeout=10)
    if reader.is_alive():
        _kill_group(proc)
        reader.join(timeout=5)
    if log_fh:
        log_fh.close()
    output = "".join(out_chunks)
    run = ChildRun(
        cmd=cmd,
        returncode=proc.returncode,
        wall_s=wall,
        output=output,
        timed_out=timed_out,
        peak_tree_rss_mb=sampler.peak_mb if sampler else None,
    )
    run.result = parse_result(output)
    return run


# --------------------------------------------------------------------------- TorchDistributor


def run_torch_distributor(train_fn: Any, cfg: dict, workers: int, marks: dict) -> dict:
    """In a child: ``TorchDistributor(num_processes=workers, local_mode=True, use_gpu=False)
    .run(train_fn, cfg, result_path)`` on a ``sparkdp.session("local[workers]")``, and the dict
    rank 0 of ``train_fn`` wrote as JSON to ``result_path``.

    ``train_fn`` must be defined in the script's ``__main__`` (cloudpickle then ships it by value to
    the torchrun processes) and write its result on rank 0: TorchDistributor's generated script has
    every rank pickle its return value to one file, so the return value is not reliable.
    Wall-clock marks go into ``marks`` (imports, session, run_start, run_end, spark_stopped).
    The torchrun processes get this folder on their ``PYTHONPATH``, so ``train_fn`` may call the
    helpers of this folder's modules (``load_blocks``...)."""
    import importlib

    problems = []
    for mod in ("torch.distributed.run", "pyspark.ml.torch.distributor", "pandas", "pyarrow"):
        try:
            importlib.import_module(mod)
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            problems.append(f"{mod}: {type(exc).__name__}: {exc}")
    if problems:
        raise RuntimeError(
            "TorchDistributor cannot run here; missing or broken imports: "
            + "; ".join(problems)
            + ". TorchDistributor needs torch (torch.distributed.run), pyspark>=3.4 with "
            "pyspark.ml, pandas and pyarrow in this interpreter."
        )
    from pyspark.ml.torch.distributor import TorchDistributor

    import sparkdp

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    marks["imports"] = time.time()
    # sparkdp sets GLOO_SOCKET_IFNAME=lo for its local process groups; do the same here.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # warm_up=False: TorchDistributor(local_mode=True) runs torchrun on the driver, no Python
    # tasks, so sparkdp's worker warm-up would only take CPU away from it.
    spark = sparkdp.session(f"local[{workers}]", warm_up=False)
    marks["session"] = time.time()
    fd, result_path = tempfile.mkstemp(prefix="td-result-", suffix=".json")
    os.close(fd)
    try:
        distributor = TorchDistributor(num_processes=workers, local_mode=True, use_gpu=False)
        marks["run_start"] = time.time()
        returned = distributor.run(train_fn, cfg, result_path)
        marks["run_end"] = time.time()
        with open(result_path, encoding="utf-8") as fh:
            text = fh.read()
        out = json.loads(text) if text.strip() else returned
    finally:
        os.unlink(result_path)
    if not out:
        raise RuntimeError("TorchDistributor returned no result from rank 0 (see the log above).")
    spark.stop()
    marks["spark_stopped"] = time.time()
    return out


# --------------------------------------------------------------------------- interleaved ways


def load_blocks(path: str) -> Any:
    """The ``input_ids`` column of a Parquet file of token blocks (``sparkdp.data.text.write_blocks``)
    as one (rows, block) int64 tensor."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    column = pq.read_table(path, columns=["input_ids"]).column("input_ids").combine_chunks()
    rows = len(column)
    return torch.from_numpy(np.asarray(column.values, dtype=np.int64).reshape(rows, -1).copy())


def child_way(way: str, cfg: dict, body: Any) -> int:
    """In a child started by :func:`run_way`: ``body(cfg, marks)``, its dict emitted as the one
    result line with ``tokens_per_s`` added where it counted tokens; any exception is printed and
    emitted as one ``error`` line for the parent. Returns the child's exit code."""
    marks = {"launch": cfg.pop("launch_time", None)}
    try:
        out = body(cfg, marks)
        if "tokens" in out:
            out["tokens_per_s"] = ratio(out["tokens"], out["train_time_s"])
        emit_result({**out, "ok": True, "way": way, "marks": marks})
        return 0
    except BaseException as exc:  # noqa: BLE001 - one clear line for the parent
        import traceback

        traceback.print_exc()
        emit_result({"ok": False, "way": way, "error": f"{type(exc).__name__}: {exc}"[:4000]})
        return 3


def run_way(
    script: str, way: str, cfg: dict, *, label: str, timeout_s: float, log_dir: str, tag: str
) -> dict[str, Any]:
    """Run ``script --child WAY --config JSON`` in a child process (:func:`run_child`), its output
    to ``log_dir/WAY-TAG.log``; its result dict with ``wall_s`` and ``log`` added, ``ok`` False
    and an ``error`` when it failed. One progress line on stderr."""
    cmd = [sys.executable, os.path.abspath(script), "--child", way, "--config"]
    cmd.append(json.dumps(dict(cfg, launch_time=time.time())))
    log_path = os.path.join(log_dir, f"{way}-{tag}.log")
    print(f"[{tag}] {label} ...", end=" ", file=sys.stderr, flush=True)
    child = run_child(cmd, timeout_s=timeout_s, env=dict(os.environ, PYTHONUNBUFFERED="1"), log_path=log_path)
    rec: dict[str, Any] = dict(child.result or {})
    rec.update(wall_s=child.wall_s, log=log_path)
    if not child.ok or not rec.get("ok"):
        rec["ok"] = False
        rec.setdefault("error", "timed out" if child.timed_out else f"exit code {child.returncode}")
        print(f"FAILED: {rec['error']}\n  log: {log_path}\n{child.tail(20)}", file=sys.stderr)
    elif "tokens_per_s" in rec:
        print(f"ok: {rec['tokens_per_s']:,.0f} tokens/s, wall {child.wall_s:.1f} s", file=sys.stderr)
    else:
        print(f"ok ({child.wall_s:.1f} s)", file=sys.stderr)
    return rec


def summarize_ways(runs: dict[str, list[dict]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per way: how many runs succeeded, the median of each of ``keys`` over them, the tokens the
    first one trained and the first failure's error."""
    out = {}
    for way, recs in runs.items():
        good = [r for r in recs if r.get("ok")]
        out[way] = {
            "ok_runs": len(good),
            "runs": len(recs),
            **{k: median(r.get(k) for r in good) for k in keys},
            "tokens": good[0].get("tokens") if good else None,
            "error": next((r.get("error") for r in recs if not r.get("ok")), None),
        }
    return out


def paired_ratios(runs: dict[str, list[dict]], a: str, b: str, key: str = "tokens_per_s") -> list[float]:
    """a's ``key`` over b's in every repeat where both ran (back to back, so machine drift cancels
    best)."""
    return [
        ra[key] / rb[key]
        for ra, rb in zip(runs.get(a, []), runs.get(b, []), strict=False)
        if ra.get("ok") and rb.get("ok") and rb.get(key)
    ]


def ratio_check(name: str, values: Sequence[float]) -> dict[str, Any]:
    """A check-table row of paired ratios without a target: their median and every repeat's."""
    m = median(values)
    shown = ", ".join(f"{v:.3f}" for v in values)
    return {"check": name, "value": m, "display": f"{m:.3f}x (repeats: {shown})", "target": "-", "pass": None}
