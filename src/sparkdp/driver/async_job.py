"""What the two parameter-server kinds share (driver/jobs/driver_server.py: the server on the
driver; driver/jobs/executor_servers.py: ``servers=K`` tasks): the server a strategy builds, an
asynchronous task's collective and its refusal of Spark's retries, the epochs the applied pushes
cover, and the job's result from the workers' reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..comm.single import IndependentCollective, SingleProcessCollective
from ..errors import WorkerLost
from ..ps import ParameterServer
from ..strategies.async_ps import AsyncParameterServer
from ..train.children import job_worker_ids
from ..train.jobs import task_device
from ..train.loop import FitSpec, evaluate
from ..train.report import WorkerReport
from ..train.result import TrainResult


def async_result(
    spec: FitSpec, reports: list[WorkerReport], workers: int, started: float, details: dict[str, Any]
) -> TrainResult:
    """An asynchronous job's result once ``spec.model`` holds the final centre: the workers'
    epochs merged, the centre evaluated, and ``details`` beside the per-worker figures."""
    model, strategy = spec.model, spec.strategy
    history: list[dict[str, Any]] = []
    first = next((r for r in reports if r.worker == 0), None)
    for epoch, evaluated in enumerate(first.history if first is not None else []):
        records = [r.history[epoch] for r in reports]
        rows = sum(rec["samples"] for rec in records)
        history.append(
            {
                **{k: v for k, v in evaluated.items() if k.startswith("test_")},
                "epoch": evaluated["epoch"],
                "loss": sum(rec["loss"] * rec["samples"] for rec in records) / max(rows, 1),
                "samples": rows,
                "epoch_time_s": max(rec["epoch_time_s"] for rec in records),
            }
        )
    if not history:  # resumed after the last epoch: nothing was left to train
        history.append(
            {"epoch": spec.part.start_epoch, "loss": float("nan"), "samples": 0, "epoch_time_s": 0.0}
        )
    if spec.eval is not None:  # the final centre, once every worker is done
        history[-1].update(
            evaluate(
                model,
                spec.loss,
                spec.eval,
                SingleProcessCollective(),
                spec.eval_batch_size,
                metric=spec.metric,
                metric_names=spec.metric_names,
            )
        )
    return TrainResult(
        model=model,
        history=history,
        strategy=strategy.name,
        workers=workers,
        epochs=spec.epochs,
        wall_s=time.perf_counter() - started,
        train_time_s=max(r.wall_end for r in reports) - min(r.wall_start for r in reports)
        if reports
        else 0.0,
        samples=sum(h["samples"] for h in history),
        strategy_options=strategy.options(),
        details={
            **details,
            "per_worker": [
                {"worker": r.worker, **r.strategy_metrics} for r in sorted(reports, key=lambda r: r.worker)
            ],
        },
    )


def refuse_spark_retry(worker: int) -> None:
    """Inside an asynchronous task: a task Spark runs again after a failure stops at once, so the
    failure reaches the driver, whose restart policy (max_restarts) decides what happens next."""
    from ..spark.task import task_attempt

    if task_attempt() > 0:
        raise WorkerLost(
            f"worker {worker}'s task failed (Spark's retry of it stops: the job's restart policy decides)"
        )


def task_collective(worker: int, workers: int, threads: int | None) -> IndependentCollective:
    """Inside an asynchronous task: torch threads from ``spark.task.cpus`` (or ``threads``) and
    the GPU Spark assigned to the task, if any, as the worker's device."""
    from ..spark.task import task_resources

    gpus, cpus = task_resources()
    torch.set_num_threads(threads or cpus)
    return IndependentCollective(worker, workers, device=task_device(gpus))


def epochs_done(
    last_seq: Callable[[int], int], spec: FitSpec, strategy: AsyncParameterServer, workers: int
) -> int:
    """Epochs every worker has finished, from its last applied push sequence (0 if unknown)."""
    steps = spec.steps_per_epoch(workers)
    if steps is None:
        return 0
    per_epoch = 1 if strategy.push_every == "epoch" else steps / strategy.push_every
    return min(spec.epochs, min(int((last_seq(w) + 1) / per_epoch) for w in range(workers)))


def remaining(spec: FitSpec, done: int) -> FitSpec:
    """``spec`` for the epochs after the first ``done`` (at most ``spec.epochs``)."""
    return replace(spec, part=replace(spec.part, start_epoch=done))


def server_factory(
    strategy: AsyncParameterServer, workers: int
) -> Callable[[list[torch.Tensor]], ParameterServer]:
    rule_spec = strategy.rule_spec(workers)
    return lambda params: ParameterServer(
        lambda shard: rule_spec.create(),
        params,
        num_shards=strategy.num_shards,
        worker_ids=job_worker_ids(workers),
        max_push_norm=strategy.max_push_norm,
    )
