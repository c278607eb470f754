"""The driver side of asynchronous training: the parameter server, independent Spark tasks."""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..comm.single import SingleProcessCollective
from ..ps import ParameterServer
from ..ps.transport import TcpOptions, TcpTransport
from ..strategies.async_ps import AsyncParameterServer
from ..train.async_job import async_worker
from ..train.loop import FitSpec, evaluate

log = logging.getLogger(__name__)


def fit_async(spec: FitSpec, strategy: AsyncParameterServer, *, workers: int, spark: Any,
              threads: int | None) -> dict[str, Any]:
    """Start the server on the driver, run ``workers`` tasks, return the centre and the history."""
    from ..spark.launcher import driver_host, run_tasks

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

        def task(worker: int) -> dict[str, Any]:
            return async_worker(spec, strategy, transport, info, worker, workers, n_threads)

        reports = run_tasks(task, workers, spark=spark, description=f"sparkdp async {strategy.rule}")
    center = server.pull(worker=workers).tensors  # an id no task uses, so no task's bookkeeping moves
    with torch.no_grad():
        for p, c in zip(model.parameters(), center):
            p.copy_(c)
    history = []
    for epoch in range(spec.epochs):
        rows = sum(r["epochs"][epoch]["rows"] for r in reports)
        loss = sum(r["epochs"][epoch]["loss_sum"] for r in reports) / max(rows, 1)
        history.append({"epoch": epoch + 1, "loss": loss, "samples": rows,
                        "epoch_time_s": max(r["epochs"][epoch]["time_s"] for r in reports)})
    first = next(r for r in reports if r["worker"] == 0)
    for record, epoch in zip(history, first["epochs"], strict=True):
        record.update(epoch.get("eval", {}))
    if spec.eval is not None:
        history[-1].update(evaluate(model, spec.loss, spec.eval, SingleProcessCollective(), spec.eval_batch_size))
    metrics = server.metrics()
    return {"history": history, "train_time_s": max(r["end"] for r in reports) - min(r["start"] for r in reports),
            "samples": sum(h["samples"] for h in history), "server": metrics,
            "workers": [{k: r[k] for k in ("worker", "pushes", "pulls", "comm_s")} for r in reports]}
