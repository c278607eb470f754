"""The driver side of asynchronous training: the parameter server, independent Spark tasks."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace
from typing import Any

import torch

from ..comm.single import IndependentCollective, SingleProcessCollective
from ..ps import ParameterServer
from ..ps.transport import TcpOptions, TcpTransport
from ..strategies.async_ps import AsyncParameterServer
from ..train.faults import fault_from_env
from ..train.loop import FitSpec, evaluate, fit_worker
from ..train.report import WorkerReport
from ..train.result import TrainResult

log = logging.getLogger(__name__)


def fit_async(spec: FitSpec, strategy: AsyncParameterServer, *, workers: int, spark: Any,
              threads: int | None, started: float) -> TrainResult:
    """Start the server on the driver, run ``workers`` tasks; the model becomes the centre."""
    from ..spark.launcher import driver_host, run_tasks, task_attempt

    model = spec.model
    rule_spec = strategy.rule_spec(workers)
    server = ParameterServer(lambda shard: rule_spec.create(), list(model.parameters()),
                             num_shards=strategy.num_shards)
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    host = driver_host(spark)
    with transport.serve(server, host=host, port=0) as endpoint:
        info = endpoint.info
        log.info("parameter server for %s on %s with %d shard(s)", strategy.rule, info.address, server.num_shards)
        n_threads = threads or 1
        shipped = replace(spec, strategy=copy.copy(strategy).connect_to(transport, info), fault=fault_from_env())

        def task(worker: int) -> WorkerReport:
            torch.set_num_threads(n_threads)
            # a retried task (Spark retries failed ordinary tasks) pulls the current centre and
            # trains its share again; an injected fault fires in the first attempt only
            attempt = shipped if task_attempt() == 0 else replace(shipped, fault=None)
            return fit_worker(attempt, IndependentCollective(worker, workers))

        reports = run_tasks(task, workers, spark=spark, description=f"sparkdp async {strategy.rule}")
    center = server.pull(worker=workers).tensors  # an id no task uses, so no task's bookkeeping moves
    with torch.no_grad():
        for p, c in zip(model.parameters(), center):
            p.copy_(c)
    history = []
    first = next(r for r in reports if r.worker == 0)
    for epoch, evaluated in enumerate(first.history):
        records = [r.history[epoch] for r in reports]
        rows = sum(rec["samples"] for rec in records)
        history.append({**{k: v for k, v in evaluated.items() if k.startswith("test_")}, "epoch": epoch + 1,
                        "loss": sum(rec["loss"] * rec["samples"] for rec in records) / max(rows, 1),
                        "samples": rows, "epoch_time_s": max(rec["epoch_time_s"] for rec in records)})
    if spec.eval is not None:  # the final centre, once every worker is done
        history[-1].update(evaluate(model, spec.loss, spec.eval, SingleProcessCollective(), spec.eval_batch_size))
    return TrainResult(
        model=model, history=history, strategy=strategy.name, workers=workers, epochs=spec.epochs,
        wall_s=time.perf_counter() - started,
        train_time_s=max(r.wall_end for r in reports) - min(r.wall_start for r in reports),
        samples=sum(h["samples"] for h in history), strategy_options=strategy.options(),
        details={"server": server.metrics(),
                 "workers": [{"worker": r.worker, **r.strategy_metrics} for r in sorted(reports, key=lambda r: r.worker)]})
