"""The task side of asynchronous training: one worker's loop against the parameter server."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import torch

from ..comm.single import SingleProcessCollective
from ..data.prefetch import prefetch
from ..ps.transport import ConnectInfo, Transport
from ..strategies.async_ps import AsyncParameterServer, AsyncWorker
from .layout import batch_layout, use_channels_last
from .loop import FitSpec, check_batch, evaluate

log = logging.getLogger(__name__)


def async_worker(spec: FitSpec, strategy: AsyncParameterServer, transport: Transport, info: ConnectInfo,
                 worker: int, num_workers: int, threads: int) -> dict[str, Any]:
    """One Spark task: train on shard ``worker`` and exchange with the server as configured.

    ``transport`` is the one that serves ``info`` (TCP from Spark tasks; the in-process
    transport runs the same loop in a unit test)."""
    torch.set_num_threads(threads)
    torch.manual_seed(spec.seed + worker)
    started = time.time()
    with transport.connect(info.address, info.secret, worker, timeout=strategy.connect_timeout_s,
                           tls_cert=info.tls_cert) as client:
        model = spec.model
        optimizer = spec.optimizer.build(model)
        scheduler = spec.scheduler(optimizer) if spec.scheduler is not None else None
        runner = AsyncWorker(strategy, client, model, optimizer, num_workers)
        # Channels-last batches only: the parameters stay NCHW because the server's shards are
        # flat views of them; the convolutions still run NHWC (train.layout).
        channels_last = use_channels_last(spec.memory_format, model, torch.device("cpu"))
        epochs = []
        for epoch in range(spec.epochs):
            t0 = time.perf_counter()
            loss_sum, rows = 0.0, 0
            batches = prefetch(spec.train.batches(rank=worker, world_size=num_workers, epoch=epoch,
                                                  batch_size=spec.batch_size, seed=spec.seed, shuffle=spec.shuffle),
                               spec.prefetch)
            for step, (x, y) in enumerate(batches):
                x = batch_layout(x, channels_last)
                if epoch == 0 and step == 0:
                    with torch.no_grad():
                        check_batch(model, spec.loss, x, y)
                optimizer.zero_grad(set_to_none=True)
                loss = spec.loss(model(x), y)
                loss.backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                runner.after_step(len(x))
                loss_sum += loss.detach().item() * len(x)
                rows += len(x)
            runner.end_epoch()
            epochs.append({"loss_sum": loss_sum, "rows": rows, "time_s": time.perf_counter() - t0})
            if worker == 0 and epoch < spec.epochs - 1 and spec.evaluates_after(epoch):
                epochs[-1]["eval"] = _evaluate_centre(spec, model, transport, info, observer=num_workers,
                                                      timeout=strategy.connect_timeout_s)
        runner.finish()
    return {"worker": worker, "epochs": epochs, "start": started, "end": time.time(),
            "pushes": runner.pushes, "pulls": runner.pulls, "comm_s": runner.comm_s}


def _evaluate_centre(spec: FitSpec, model: torch.nn.Module, transport: Transport, info: ConnectInfo,
                     observer: int, timeout: float) -> dict[str, float]:
    """Test metrics of the server's centre as worker 0 finishes an epoch (the other workers go on;
    the driver evaluates the final centre once every worker is done).

    The centre is pulled under ``observer``, an id no task uses (the driver's too): a pull as
    worker 0 would move its staleness version and its DC-ASGD backup."""
    with transport.connect(info.address, info.secret, observer, timeout=timeout, tls_cert=info.tls_cert) as client:
        centre = client.pull().tensors
    scratch = copy.deepcopy(model)
    with torch.no_grad():
        for p, c in zip(scratch.parameters(), centre, strict=True):
            p.copy_(c)
    return evaluate(scratch, spec.loss, spec.eval, SingleProcessCollective(), spec.eval_batch_size)
