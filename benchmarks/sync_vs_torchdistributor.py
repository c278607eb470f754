"""Synchronous data-parallel training: sparkdp ``allreduce`` vs PySpark's TorchDistributor vs one process.

The same Fashion-MNIST job (2-conv CNN, batch 64 per worker, SGD lr 0.05 momentum 0.9,
2 workers, 2 epochs) is run three ways in one invocation on the same machine:

  sparkdp      ``sparkdp.fit(..., strategy="allreduce", workers=2)`` on a local[2] session
  torchdist    ``pyspark.ml.torch.distributor.TorchDistributor(num_processes=2, local_mode=True,
               use_gpu=False).run(train_fn)`` where ``train_fn`` is a plain DDP loop
               (gloo, DistributedSampler, 1 torch thread per process), on a local[2] session
               started the same way (``sparkdp.session("local[2]", warm_up=False)``: with
               local_mode=True no Python task runs, so there is no worker daemon to warm up)
  single       one PyTorch process with 2 threads at batch workers x batch (128): the
               accuracy reference

All three take the same rows in every step: the same initial weights (seed r in repeat
r), the same permutation of the rows per epoch (seed r * 1_000_003 + epoch; the DDP loop's
DistributedSampler gets seed r * 1_000_003), each worker every world-th row of it, and the
single process the union of one step's worker batches. So they run one optimisation and
differ only in rounding: the single process is "one process on the concatenated batch",
the equivalence ``allreduce`` promises.

All three evaluate the test set once, after the last epoch (sparkdp: ``eval_every=epochs``;
its default evaluates after every epoch, which the other two loops do not do).

Each way runs in a fresh child process of this interpreter, so interpreter start,
imports, Spark start-up and shutdown all count in its wall time (measured by this
parent around the child). Each child prints one JSON line that the parent collects.
With ``--repeats R`` the ways run interleaved (A B C A B C ...) and medians are reported;
repeat r (0-based) seeds every way with r, so accuracies are compared over R seeds.

Targets: sparkdp training throughput >= 1.0x TorchDistributor's; sparkdp total
wall time <= 0.9x TorchDistributor's; sparkdp test accuracy within 0.5 points of the
single-process run. Each is checked on the median of the per-repeat (paired) values.

Run:  python benchmarks/sync_vs_torchdistributor.py                       # the full job
      python benchmarks/sync_vs_torchdistributor.py --model cnn-small --epochs 1 --limit 4000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (  # noqa: E402
    emit_result,
    fmt,
    machine_info,
    markdown_table,
    median,
    pass_fail,
    ratio,
    run_child,
    run_torch_distributor,
    self_peak_rss_mb,
    write_json,
)

WAYS = ("sparkdp", "torchdist", "single")
LABELS = {"sparkdp": "sparkdp allreduce", "torchdist": "TorchDistributor+DDP", "single": "single process"}
TARGET_THROUGHPUT = 1.0  # sparkdp samples/s / TorchDistributor samples/s >=
TARGET_WALL = 0.9  # sparkdp wall / TorchDistributor wall <=
TARGET_ACC_GAP = 0.5  # |sparkdp - single| test accuracy, percentage points <=


# =========================================================================== children
#
# Everything below runs in a child process (``--child WAY``). ``_td_train_fn`` and the
# helpers it calls are defined in __main__, so TorchDistributor's cloudpickle ships them
# by value to the torchrun processes; they import only torch and sparkdp (installed).


def _batches_from_indices(x, y, idx, batch_size):
    for start in range(0, len(idx), batch_size):
        take = idx[start : start + batch_size]
        yield x[take], y[take]


def _evaluate(model, x, y, batch_size=1000):
    """Test accuracy (fraction) and mean loss over all of (x, y)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            out = model(xb)
            loss_sum += float(F.cross_entropy(out, yb, reduction="sum"))
            correct += int((out.argmax(1) == yb).sum())
    model.train()
    return correct / len(x), loss_sum / len(x)


def _td_train_fn(cfg: dict, result_path: str) -> dict:
    """A plain PyTorch DDP loop, as a TorchDistributor user would write it."""
    import time

    t_fn_start = time.time()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from sparkdp.data import load_dataset
    from sparkdp.models.zoo import build_model

    torch.set_num_threads(1)  # as sparkdp does for spark.task.cpus=1
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t_pg = time.time()
    ds = load_dataset("fashion-mnist", limit=cfg["limit"])
    x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    dataset = TensorDataset(x, y)
    t_data = time.time()

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"])
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    # DistributedSampler draws randperm(seed + epoch) and gives rank r every world-th index
    # from r, as sparkdp and the single process do with seed * 1_000_003 + epoch: this seed
    # makes all three ways take the same rows in every step.
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=cfg["seed"] * 1_000_003
    )
    loader = None
    if cfg["td_loader"] == "dataloader":
        loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler)

    history = []
    for epoch in range(cfg["epochs"]):
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        stats = torch.zeros(2, dtype=torch.float64)
        if loader is not None:
            batches = iter(loader)
        else:  # the sampler's indices, sliced from the in-memory tensors (as sparkdp does)
            batches = _batches_from_indices(x, y, torch.tensor(list(iter(sampler))), cfg["batch_size"])
        for xb, yb in batches:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            stats[0] += loss.detach().item() * len(xb)
            stats[1] += len(xb)
        elapsed = time.perf_counter() - started
        dist.all_reduce(stats)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": stats[0].item() / max(stats[1].item(), 1.0),
                "samples": int(stats[1].item()),
                "epoch_time_s": elapsed,
            }
        )
    t_train_end = time.time()

    acc = test_loss = None
    if rank == 0:
        xt, yt = torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test)
        acc, test_loss = _evaluate(model, xt, yt)
    t_eval_end = time.time()
    result = {
        "history": history,
        "test_accuracy": acc,
        "test_loss": test_loss,
        "train_time_s": sum(h["epoch_time_s"] for h in history),
        "samples": sum(h["samples"] for h in history),
        "world_size": world,
        "marks": {
            "fn_start": t_fn_start,
            "pg_ready": t_pg,
            "data_loaded": t_data,
            "train_end": t_train_end,
            "eval_end": t_eval_end,
        },
    }
    # TorchDistributor's generated script makes EVERY rank pickle its return value to the
    # same output file; give all ranks rank 0's result so whichever write lands last is right.
    box = [result]
    dist.broadcast_object_list(box, src=0)
    result = box[0]
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    return result


def _load(cfg: dict):
    from sparkdp.data import load_dataset

    return load_dataset("fashion-mnist", limit=cfg["limit"])


def _child_sparkdp(cfg: dict, marks: dict) -> dict:
    import torch

    import sparkdp
    from sparkdp.models.zoo import build_model

    marks["imports"] = time.time()
    spark = sparkdp.session(f"local[{cfg['workers']}]")
    marks["session"] = time.time()
    ds = _load(cfg)
    marks["data_loaded"] = time.time()
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"])
    res = sparkdp.fit(
        model,
        (ds.x_train, ds.y_train),
        eval_data=(ds.x_test, ds.y_test),
        optimizer="sgd",
        optimizer_options={"lr": cfg["lr"], "momentum": cfg["momentum"]},
        strategy="allreduce",
        workers=cfg["workers"],
        epochs=cfg["epochs"],
        batch_size=cfg["batch_size"],
        seed=cfg["seed"],
        spark=spark,
        show_progress=False,
        eval_every=cfg["epochs"],
        memory_format=cfg.get("memory_format", "auto"),
    )
    marks["fit_end"] = time.time()
    steps = sum(math.ceil(h["samples"] / (cfg["workers"] * cfg["batch_size"])) for h in res.history)
    worker_wall = res.details.get("worker_wall") or {}
    marks["worker_start"], marks["worker_end"] = worker_wall.get("start"), worker_wall.get("end")
    spark.stop()
    marks["spark_stopped"] = time.time()
    return {
        "history": [{k: v for k, v in h.items()} for h in res.history],
        "epoch_times_s": [h["epoch_time_s"] for h in res.history],
        "train_time_s": res.train_time_s,
        "samples": res.samples,
        "samples_per_s": res.samples_per_s,
        "test_accuracy": res.test_accuracy,
        "fit_wall_s": res.wall_s,
        "strategy_options": res.strategy_options,
        # rank 0's mean step and the part of it spent in the gradients' all-reduce hooks (waiting
        # for the other rank included)
        "step_ms": 1e3 * res.train_time_s / steps,
        "comm_ms_per_step": 1e3 * res.details.get("comm", {}).get("comm_s", 0.0) / steps,
    }


def _child_torchdist(cfg: dict, marks: dict) -> dict:
    out = run_torch_distributor(_td_train_fn, cfg, cfg["workers"], marks)
    for key, value in out.pop("marks", {}).items():
        marks[f"rank0_{key}"] = value
    train = out["train_time_s"]
    return {
        "history": out["history"],
        "epoch_times_s": [h["epoch_time_s"] for h in out["history"]],
        "train_time_s": train,
        "samples": out["samples"],
        "samples_per_s": out["samples"] / train if train > 0 else None,
        "test_accuracy": out["test_accuracy"],
        "world_size": out["world_size"],
    }


def _child_single(cfg: dict, marks: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from sparkdp.models.zoo import build_model

    torch.set_num_threads(cfg["single_threads"])
    marks["imports"] = time.time()
    ds = _load(cfg)
    x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
    marks["data_loaded"] = time.time()
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"])
    layout = (
        torch.channels_last if cfg.get("single_memory_format") == "channels_last" else torch.contiguous_format
    )
    model.to(memory_format=layout)  # a no-op for contiguous; restrides the 4-D weights for channels_last
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    history = []
    for epoch in range(cfg["epochs"]):
        gen = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + epoch)
        idx = torch.randperm(len(x), generator=gen)
        started = time.perf_counter()
        loss_sum, rows = 0.0, 0
        for xb, yb in _batches_from_indices(x, y, idx, cfg.get("single_batch_size") or cfg["batch_size"]):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb.to(memory_format=layout) if xb.dim() == 4 else xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.detach().item() * len(xb)
            rows += len(xb)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": loss_sum / max(rows, 1),
                "samples": rows,
                "epoch_time_s": time.perf_counter() - started,
            }
        )
    marks["train_end"] = time.time()
    acc, _ = _evaluate(model, torch.from_numpy(ds.x_test), torch.from_numpy(ds.y_test))
    marks["eval_end"] = time.time()
    train = sum(h["epoch_time_s"] for h in history)
    batch = cfg.get("single_batch_size") or cfg["batch_size"]
    samples = sum(h["samples"] for h in history)
    return {
        "history": history,
        "epoch_times_s": [h["epoch_time_s"] for h in history],
        "train_time_s": train,
        "samples": samples,
        "samples_per_s": samples / train if train > 0 else None,
        "test_accuracy": acc,
        "step_ms": 1e3 * train / sum(math.ceil(h["samples"] / batch) for h in history),
    }


def child_main(way: str, cfg: dict) -> int:
    marks = {"launch": cfg.pop("launch_time", None), "child_start": _CHILD_START}
    try:
        body = {"sparkdp": _child_sparkdp, "torchdist": _child_torchdist, "single": _child_single}[way]
        out = body(cfg, marks)
        out.update(ok=True, way=way, marks=marks, driver_peak_rss_mb=self_peak_rss_mb())
        emit_result(out)
        return 0
    except BaseException as exc:  # noqa: BLE001 - one clear line for the parent
        import traceback

        traceback.print_exc()
        emit_result({"ok": False, "way": way, "error": f"{type(exc).__name__}: {exc}"[:4000], "marks": marks})
        return 3


_CHILD_START = time.time()


# =========================================================================== parent


def phase_breakdown(way: str, marks: dict, wall_s: float, train_s: float = 0.0) -> dict[str, float | None]:
    """Seconds spent in each phase of a child, from its wall-clock marks (``train_s``: its
    training time, which sparkdp's rank 0 spends inside its loop)."""

    def gap(a: str, b: str) -> float | None:
        return marks[b] - marks[a] if marks.get(a) is not None and marks.get(b) is not None else None

    out: dict[str, float | None] = {"interpreter+imports": gap("launch", "imports")}
    if way == "sparkdp":
        out.update(
            {
                "spark session": gap("imports", "session"),
                "load data (driver)": gap("session", "data_loaded"),
                "fit() call": gap("data_loaded", "fit_end"),
                "fit: until rank 0's loop starts": gap("data_loaded", "worker_start"),
                "fit: rank 0's loop outside its epochs": (
                    in_loop - train_s if (in_loop := gap("worker_start", "worker_end")) is not None else None
                ),
                "fit: rank 0 reported -> fit returns": gap("worker_end", "fit_end"),
                "spark.stop": gap("fit_end", "spark_stopped"),
            }
        )
    elif way == "torchdist":
        out.update(
            {
                "spark session": gap("imports", "session"),
                "TorchDistributor.run": gap("run_start", "run_end"),
                "run: torchrun start -> train_fn (rank 0)": gap("run_start", "rank0_fn_start"),
                "run: process group": gap("rank0_fn_start", "rank0_pg_ready"),
                "run: load data (per rank)": gap("rank0_pg_ready", "rank0_data_loaded"),
                "run: build model + train (rank 0)": gap("rank0_data_loaded", "rank0_train_end"),
                "run: evaluate (rank 0)": gap("rank0_train_end", "rank0_eval_end"),
                "run: train_fn end -> run returns": gap("rank0_eval_end", "run_end"),
                "spark.stop": gap("run_end", "spark_stopped"),
            }
        )
    else:
        out.update(
            {
                "load data": gap("imports", "data_loaded"),
                "train": gap("data_loaded", "train_end"),
                "evaluate": gap("train_end", "eval_end"),
            }
        )
    last = max((v for k, v in marks.items() if v is not None and k != "launch"), default=None)
    if last is not None and marks.get("launch") is not None:
        out["after last mark -> exit"] = wall_s - (last - marks["launch"])
    return out


def summarize(way: str, runs: list[dict]) -> dict[str, Any]:
    good = [r for r in runs if r.get("ok")]
    summary: dict[str, Any] = {"way": way, "label": LABELS[way], "runs": len(runs), "ok_runs": len(good)}
    if not good:
        summary["error"] = next((r.get("error") for r in runs if r.get("error")), "no result")
        return summary
    n_epochs = max(len(r["epoch_times_s"]) for r in good)
    summary["epoch_times_s"] = [
        median(r["epoch_times_s"][i] for r in good if len(r["epoch_times_s"]) > i) for i in range(n_epochs)
    ]
    for key in (
        "train_time_s",
        "samples_per_s",
        "test_accuracy",
        "wall_s",
        "peak_tree_rss_mb",
        "driver_peak_rss_mb",
        "step_ms",
        "comm_ms_per_step",
    ):
        summary[key] = median(r.get(key) for r in good)
    summary["samples"] = good[0]["samples"]
    phases: dict[str, list] = {}
    for r in good:
        for k, v in r.get("phases", {}).items():
            phases.setdefault(k, []).append(v)
    summary["phases_s"] = {k: median(v) for k, v in phases.items()}
    summary["all_walls_s"] = [r["wall_s"] for r in good]
    summary["all_samples_per_s"] = [r["samples_per_s"] for r in good]
    return summary


def print_report(
    cfg: dict, summaries: dict[str, dict], checks: list[dict], runs: dict[str, list[dict]]
) -> None:
    print()
    print(
        f"## sparkdp allreduce vs TorchDistributor vs single process — {cfg['model']}, "
        f"{cfg['workers']} workers, batch {cfg['batch_size']}/worker, SGD lr {cfg['lr']} momentum {cfg['momentum']}, "
        f"{cfg['epochs']} epoch(s), {'all' if not cfg['limit'] else cfg['limit']} rows, "
        f"{cfg['repeats']} repeat(s) (medians)"
        + (f"; single process at batch {cfg['single_batch_size']}" if cfg.get("single_batch_size") else "")
    )
    print()
    headers = [
        "way",
        "epoch times (s)",
        "train (s)",
        "samples/s",
        "wall (s)",
        "wall - train (s)",
        "test acc (%)",
        "peak RSS, all procs (MiB)",
    ]
    rows = []
    for s in summaries.values():
        if not s.get("ok_runs"):
            rows.append([s["label"], "FAILED", None, None, None, None, None, None])
            continue
        epochs = " / ".join(fmt(t) for t in s["epoch_times_s"])
        acc = s["test_accuracy"] * 100 if s["test_accuracy"] is not None else None
        rows.append(
            [
                s["label"],
                epochs,
                s["train_time_s"],
                s["samples_per_s"],
                s["wall_s"],
                s["wall_s"] - s["train_time_s"],
                acc,
                s["peak_tree_rss_mb"],
            ]
        )
    print(markdown_table(headers, rows))
    print()
    print(per_repeat_table(runs, cfg))
    print()
    print(
        markdown_table(
            ["check", "measured", "target", "result"],
            [[c["check"], c["display"], c["target"], pass_fail(c["pass"])] for c in checks],
        )
    )
    print()
    print("Where the wall time goes (medians, seconds; from wall-clock marks in each child):")
    print()
    for s in summaries.values():
        if s.get("ok_runs"):
            parts = ", ".join(f"{k} {fmt(v, 1)}" for k, v in s["phases_s"].items() if v is not None)
            print(f"- {s['label']}: {parts}")
    sp = summaries.get("sparkdp", {})
    if sp.get("ok_runs") and sp.get("step_ms") is not None:
        print(
            f"- sparkdp's step (rank 0, mean): {sp['step_ms']:.1f} ms, of which "
            f"{sp['comm_ms_per_step']:.1f} ms in the gradient all-reduce (waiting for the other rank included)"
            + (
                f"; the single process's step (the same rows on {cfg['single_threads']} threads): "
                f"{one['step_ms']:.1f} ms"
                if (one := summaries.get("single", {})).get("step_ms") is not None
                else ""
            )
        )
    for s in summaries.values():
        if not s.get("ok_runs"):
            print(f"\n**{s['label']} FAILED**: {s.get('error')}")
    print()


def per_repeat_table(runs: dict[str, list[dict]], cfg: dict) -> str:
    """One row per repeat: each way's wall / samples/s / accuracy, the ratios and the accuracy gap."""
    ways = list(runs)
    n = max((len(v) for v in runs.values()), default=0)
    headers = ["repeat (seed)"] + [f"{LABELS[w]}: wall s / samples/s / acc %" for w in ways]
    has = {w: w in runs for w in WAYS}
    if has["sparkdp"] and has["torchdist"]:
        headers += ["wall ratio", "throughput ratio"]
    if has["sparkdp"] and has["single"]:
        headers += ["acc gap (points)"]
    rows = []
    for i in range(n):
        rec = {w: runs[w][i] if i < len(runs[w]) and runs[w][i].get("ok") else None for w in ways}
        row = [f"{i + 1} ({cfg['seed'] + i})"]
        for w in ways:
            r = rec[w]
            row.append(
                "failed"
                if r is None
                else f"{r['wall_s']:.1f} / {r['samples_per_s']:,.0f} / {100 * r['test_accuracy']:.2f}"
            )
        sp, td, single = rec.get("sparkdp"), rec.get("torchdist"), rec.get("single")
        if has["sparkdp"] and has["torchdist"]:
            row += [
                f"{sp['wall_s'] / td['wall_s']:.3f}" if sp and td else "-",
                f"{sp['samples_per_s'] / td['samples_per_s']:.3f}" if sp and td else "-",
            ]
        if has["sparkdp"] and has["single"]:
            row.append(
                f"{100 * (sp['test_accuracy'] - single['test_accuracy']):+.2f}" if sp and single else "-"
            )
        rows.append(row)
    return markdown_table(headers, rows)


def paired(runs: dict[str, list[dict]], a: str, b: str, value) -> list[float]:
    """``value(run_a, run_b)`` for every repeat in which both ways completed."""
    return [
        value(ra, rb)
        for ra, rb in zip(runs.get(a, []), runs.get(b, []), strict=False)
        if ra.get("ok") and rb.get("ok")
    ]


def build_checks(summaries: dict[str, dict], runs: dict[str, list[dict]]) -> list[dict]:
    """The three targets (module docstring), each checked on the median of the per-repeat (paired) values.

    Ways of one repeat run back to back, so a ratio within a repeat is what drifts in
    machine speed between repeats disturb least; the ratio of the medians is shown beside it.
    """
    sp, td, single = (summaries.get(w, {}) for w in WAYS)
    thr = paired(runs, "sparkdp", "torchdist", lambda a, b: a["samples_per_s"] / b["samples_per_s"])
    wall = paired(runs, "sparkdp", "torchdist", lambda a, b: a["wall_s"] / b["wall_s"])
    gap = paired(runs, "sparkdp", "single", lambda a, b: 100 * (a["test_accuracy"] - b["test_accuracy"]))

    def of_medians(key, scale=1.0, diff=False):
        x, y = sp.get(key), (single if diff else td).get(key)
        if x is None or y is None:
            return None
        return (x - y) * scale if diff else ratio(x, y)

    def check(name, values, target, passes, fmt_value, beside):
        m = median(values) if values else None
        spread = ", ".join(fmt_value(v) for v in values)
        return {
            "check": name,
            "value": m,
            "per_repeat": values,
            "of_medians": beside,
            "display": "-"
            if m is None
            else f"{fmt_value(m)} (repeats: {spread}; of the medians: "
            f"{'-' if beside is None else fmt_value(beside)})",
            "target": target,
            "pass": None if m is None else passes(m),
        }

    return [
        check(
            "sparkdp / TorchDistributor training throughput",
            thr,
            f">= {TARGET_THROUGHPUT}x",
            lambda v: v >= TARGET_THROUGHPUT,
            lambda v: f"{v:.3f}x",
            of_medians("samples_per_s"),
        ),
        check(
            "sparkdp / TorchDistributor total wall time",
            wall,
            f"<= {TARGET_WALL}x",
            lambda v: v <= TARGET_WALL,
            lambda v: f"{v:.3f}x",
            of_medians("wall_s"),
        ),
        check(
            "test accuracy, sparkdp - single process (points)",
            gap,
            f"|gap| <= {TARGET_ACC_GAP}",
            lambda v: abs(v) <= TARGET_ACC_GAP,
            lambda v: f"{v:+.2f}",
            of_medians("test_accuracy", 100, True),
        ),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn-small"])
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="use only the first N training (and test) rows, for a quick run",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="R",
        help="run each way R times, interleaved, and report medians",
    )
    p.add_argument("--json-out", metavar="FILE", help="also write every run and the summary as JSON here")
    p.add_argument("--skip-single", action="store_true", help="skip the single-process reference run")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {', '.join(WAYS)}")
    p.add_argument(
        "--single-batch-size",
        type=int,
        metavar="N",
        help="the single process's batch (default: workers x batch size, the batch one synchronous "
        "step of the workers equals: with the same seed it takes the same rows per step)",
    )
    p.add_argument(
        "--memory-format",
        choices=["auto", "channels_last", "contiguous"],
        default="auto",
        help="sparkdp's fit(memory_format=...) (default auto: channels-last on CPU workers)",
    )
    p.add_argument(
        "--single-memory-format",
        choices=["contiguous", "channels_last"],
        default="contiguous",
        help="the single process's layout (default contiguous: plain PyTorch)",
    )
    p.add_argument(
        "--first-seed", type=int, default=0, metavar="S", help="repeat r uses seed S + r (default 0)"
    )
    p.add_argument("--skip-torchdist", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="per worker (the single process takes workers x this; see --single-batch-size)",
    )
    p.add_argument(
        "--td-loader",
        choices=["slice", "dataloader"],
        default="slice",
        help="TorchDistributor loop: slice the in-memory tensors by the DistributedSampler's "
        "indices (default, as sparkdp does) or use a torch DataLoader over a TensorDataset",
    )
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="per child process (seconds)")
    p.add_argument("--log-dir", help="where each child's output goes (default: a new temp directory)")
    p.add_argument("--verbose", "-v", action="store_true", help="echo the children's output")
    p.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("epochs", "repeats", "workers", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.single_batch_size is not None and args.single_batch_size < 1:
        p.error("--single-batch-size must be >= 1")
    if args.first_seed < 0:
        p.error("--first-seed must be >= 0")
    if args.limit is not None and args.limit < args.workers:
        p.error("--limit must be at least --workers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, json.loads(args.config))

    cfg = {
        "model": args.model,
        "epochs": args.epochs,
        "limit": args.limit,
        "workers": args.workers,
        "batch_size": args.batch_size,
        "lr": 0.05,
        "momentum": 0.9,
        "seed": args.first_seed,
        "td_loader": args.td_loader,
        "single_threads": 2,
        "repeats": args.repeats,
        "single_batch_size": args.single_batch_size or args.workers * args.batch_size,
        "memory_format": args.memory_format,
        "single_memory_format": args.single_memory_format,
    }
    chosen = args.ways.split(",")
    if not set(chosen) <= set(WAYS):
        raise SystemExit(f"--ways takes a comma-separated subset of {', '.join(WAYS)}; got {args.ways!r}")
    ways = [
        w
        for w in WAYS
        if w in chosen
        and not (w == "single" and args.skip_single)
        and not (w == "torchdist" and args.skip_torchdist)
    ]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="sparkdp-bench-sync-")
    os.makedirs(log_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    print(
        f"sync_vs_torchdistributor: {', '.join(ways)} x {args.repeats}; child logs in {log_dir}; "
        f"machine {machine_info()}",
        file=sys.stderr,
    )

    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for rep in range(args.repeats):
        for way in ways:
            # Repeat r seeds all three ways with r (initial weights, shuffles): the accuracy
            # median is then over seeds, not over replays of one trajectory.
            child_cfg = dict(cfg, launch_time=time.time(), seed=cfg["seed"] + rep)
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                way,
                "--config",
                json.dumps(child_cfg),
            ]
            log_path = os.path.join(log_dir, f"{way}-{rep + 1}.log")
            print(f"[{rep + 1}/{args.repeats}] {LABELS[way]} ...", end=" ", file=sys.stderr, flush=True)
            child = run_child(cmd, timeout_s=args.timeout, env=env, log_path=log_path, echo=args.verbose)
            rec: dict[str, Any] = dict(child.result or {})
            rec.update(
                wall_s=child.wall_s,
                returncode=child.returncode,
                timed_out=child.timed_out,
                peak_tree_rss_mb=child.peak_tree_rss_mb,
                log=log_path,
                repeat=rep + 1,
            )
            if child.timed_out:
                rec.update(ok=False, error=f"timed out after {args.timeout:.0f} s (process group killed)")
            elif not child.result:
                rec.update(
                    ok=False,
                    error=f"exit code {child.returncode} and no result line; last output:\n{child.tail(30)}",
                )
            elif child.returncode != 0:
                rec["ok"] = False
            if rec.get("ok"):
                rec["phases"] = phase_breakdown(
                    way, rec.get("marks", {}), child.wall_s, rec.get("train_time_s") or 0.0
                )
                print(
                    f"ok: wall {child.wall_s:.1f} s, {rec['samples_per_s']:.0f} samples/s, "
                    f"acc {100 * rec['test_accuracy']:.2f}%",
                    file=sys.stderr,
                )
            else:
                print("FAILED", file=sys.stderr)
                what = "TorchDistributor" if way == "torchdist" else LABELS[way]
                print(
                    f"  {what} failed: {rec.get('error')}\n  full log: {log_path}\n"
                    + "\n".join("  | " + ln for ln in child.tail(25).splitlines()),
                    file=sys.stderr,
                )
            runs[way].append(rec)

    summaries = {w: summarize(w, runs[w]) for w in ways}
    checks = build_checks(summaries, runs)
    print_report(cfg, summaries, checks, runs)
    if args.json_out:
        write_json(
            args.json_out,
            {
                "benchmark": "sync_vs_torchdistributor",
                "config": cfg,
                "machine": machine_info(),
                "summary": summaries,
                "checks": checks,
                "runs": runs,
                "log_dir": log_dir,
            },
        )
        print(f"JSON written to {args.json_out}", file=sys.stderr)
    return 0 if all(s.get("ok_runs") == s.get("runs") for s in summaries.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
