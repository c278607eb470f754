"""Parameter servers as Spark tasks: K server tasks on the executors, beside the workers.

One server on the driver carries ``2 * S`` bytes per worker step over the driver's one link;
from a few workers on, that link is the job's limit (``sparkdp plan`` marks it). With
``servers=K`` the job is one barrier stage of ``K + workers`` tasks: task ``s < K`` serves key
range ``s`` of a byte-balanced :class:`~sparkdp.ps.sharding.ShardPlan` on its own executor's
address, task ``K + w`` is worker ``w``, pushing and pulling every server at once
(:class:`~sparkdp.ps.transport.sharded.ShardedClient`). How the addresses travel, what stays the
same and how a lost task restarts from every server's newest checkpoint: see
docs/guide/strategies.md, Servers on the executors, and docs/architecture.md, How an
asynchronous job flows.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch

from .. import state as state_io
from ..config import JobConfig
from ..errors import ConfigError
from ..monitor.probe import MonitorLink
from ..ps import ParameterServer
from ..ps.auth import new_secret
from ..ps.server import Pulled
from ..ps.sharding import ShardPlan
from ..ps.transport import TcpOptions, TcpTransport
from ..ps.transport.sharded import ShardedInfo, ShardedTransport
from ..strategies.async_ps import AsyncParameterServer
from ..train.checkpoint import CheckpointPolicy
from ..train.checkpoint_store import CheckpointStore, new_job_id, server_series
from ..train.faults import Fault, fault_from_env
from ..train.loop import FitSpec, fit_worker
from ..train.report import WorkerReport
from ..train.result import TrainResult
from .async_job import (
    ServerCheckpoints,
    async_result,
    epochs_done,
    load_latest,
    remaining,
    server_factory,
    task_collective,
)
from .controller import Attempt, Controller, RestartPolicy

log = logging.getLogger(__name__)

#: counted metrics: every push and pull reaches every server, so each server counts it once
_COUNTS = ("pulls", "pushes_applied", "duplicates_dropped", "rejected")


def fit_on_executors(
    spec: FitSpec,
    job: JobConfig,
    *,
    workers: int,
    spark: Any,
    started: float,
    hub: Any = None,
    job_id: str | None = None,
) -> TrainResult:
    """Train with ``spec.strategy.servers`` server tasks beside ``workers`` worker tasks (``spec``:
    the whole job, from its first epoch; ``job_id``: the identity of the servers' checkpoints, a
    resumed job's those it resumes)."""
    from ..spark.cluster import available_slots, on_driver_machine

    strategy = cast(AsyncParameterServer, spec.strategy)
    centre = [p.detach().to("cpu").contiguous() for p in spec.model.parameters()]
    plan = ShardPlan.build(centre, strategy.servers)
    servers = plan.num_shards
    if servers < (strategy.servers or 1):
        log.warning(
            "the model splits into %d key ranges only: %d server task(s), not %d",
            servers,
            servers,
            strategy.servers,
        )
    directory = job.checkpoints.checkpoint_dir or job.checkpoints.resume
    if hub is not None:  # the live display's server line, from the server tasks' own records
        hub.server_metrics = lambda: combined(list(hub.servers.values()))
    with contextlib.ExitStack() as stack:
        if directory is None and on_driver_machine(spark):  # executors share the driver's disk
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="sparkdp-ps-"))
        whole, job_id = spec, job_id or new_job_id()
        policy = (
            CheckpointPolicy(replace(job.checkpoints, checkpoint_dir=directory), job_id)
            if directory is not None
            else None
        )
        if policy is not None:
            policy.store().check_writable()
        load: list[bytes | None] = [None] * servers
        if job.checkpoints.resume is not None:
            resume = CheckpointPolicy(
                replace(job.checkpoints, checkpoint_dir=str(job.checkpoints.resume)), job_id
            )
            spec, load = _resume(whole, strategy, plan, workers, resume.store(), required=True)
        stage = _Stage(spec, strategy, plan, workers, job, policy, new_secret(), fault_from_env())
        restarts = RestartPolicy.of(job)
        controller: Controller[list[Any]] = Controller(
            restarts, workers, lambda: _worker_slots(available_slots(spark), servers)
        )
        restartable = _ServerStages(stage, whole, spark, load)
        results = controller.run(restartable)
        spec, load = stage.spec, restartable.load
    shards, reports = results[:servers], results[servers:]  # by rank: the servers, then the workers
    if shards:
        _copy_centre(plan, [s["centre"] for s in shards], spec.model)
    elif all(state is not None for state in load):  # resumed with nothing left to train: the saved centre
        _copy_centre(plan, [state_io.from_bytes(cast(bytes, state))["center"] for state in load], spec.model)
    metrics = [{k: v for k, v in s.items() if k != "centre"} for s in shards]
    result = async_result(
        spec, reports, controller.now, started, {"server": combined(metrics), "servers": metrics}
    )
    result.details["restarts"] = list(restarts.failures)
    return result


class _ServerStages:
    """The controller's plan for servers on the executors: a restart continues from every
    server's newest checkpoint, on the workers the controller says."""

    def __init__(self, stage: _Stage, whole: FitSpec, spark: Any, load: list[bytes | None]) -> None:
        self.stage, self.whole, self.spark, self.load = stage, whole, spark, load

    def attempt(self, attempt: Attempt) -> list[Any]:
        stage = self.stage
        if attempt.restart:
            stage.workers = attempt.workers
            assert stage.policy is not None  # restart_point gave no restart otherwise
            stage.spec, self.load = _resume(
                self.whole, stage.strategy, stage.plan, attempt.workers, stage.policy.store(), required=False
            )
            stage.fault = None  # an injected fault fires once per job
        return stage.run(self.spark, self.load) if stage.spec.epochs else []

    def restart_point(self) -> str | None:
        if self.stage.policy is None:
            log.warning(
                "the servers on the executors keep no checkpoints, so this failure ends the job: "
                "give checkpoint_dir (a directory the driver and every executor reach) to restart"
            )
            return None
        return "the servers' newest checkpoints"


def _worker_slots(slots: int | None, servers: int) -> int | None:
    """The task slots left for workers beside the ``servers`` server tasks (None: unknown)."""
    return None if slots is None else max(slots - servers, 0)


def combined(per_server: list[dict[str, Any]]) -> dict[str, Any]:
    """One server's figures for K of them: bytes summed, counts and staleness as the server
    that applied the most pushes saw them (each push reaches every server)."""
    if not per_server:
        return {}
    busiest = max(per_server, key=lambda m: m["pushes_applied"])
    return {
        **{k: max(m[k] for m in per_server) for k in _COUNTS},
        "bytes_in": sum(m["bytes_in"] for m in per_server),
        "bytes_out": sum(m["bytes_out"] for m in per_server),
        "staleness": busiest["staleness"],
    }


def _resume(
    spec: FitSpec,
    strategy: AsyncParameterServer,
    plan: ShardPlan,
    workers: int,
    store: CheckpointStore,
    *,
    required: bool,
) -> tuple[FitSpec, list[bytes | None]]:
    """The state of every server's newest readable checkpoint of this job (``store.job_id``) in
    ``store`` and ``spec`` for the epochs they do not cover; a server without one starts from
    ``spec``'s model (``required``: refuse). The states travel to the server tasks themselves: a
    task of the failed attempt that Spark has not stopped yet may still save and prune the files."""
    names: list[str | None] = []
    books: list[ParameterServer | None] = []
    for s in range(plan.num_shards):
        server = server_factory(strategy, workers)(_pieces(plan, spec.model, s))
        series = server_series(s, plan.num_shards)
        try:
            names.append(load_latest(server, store, series))
            books.append(server)
        except ConfigError:
            if required or store.names(series, store.job_id):
                raise
            names.append(None)
            books.append(None)
    done = epochs_done(
        lambda w: min(b.last_seq(w) if b is not None else -1 for b in books), spec, strategy, workers
    )
    log.info(
        "the %d servers resume from %s: %d of %d epoch(s) covered by the applied pushes",
        plan.num_shards,
        ", ".join(n or "their start" for n in names),
        done,
        spec.epochs,
    )
    states = [state_io.to_bytes(b.state_dict()) if b is not None else None for b in books]
    return remaining(spec, done), states


def _pieces(plan: ShardPlan, model: torch.nn.Module, shard: int) -> list[torch.Tensor]:
    return [
        p.clone() for p in plan.views([t.detach().to("cpu").contiguous() for t in model.parameters()], shard)
    ]


def _copy_centre(plan: ShardPlan, parts: list[list[torch.Tensor]], model: torch.nn.Module) -> None:
    dense = [p.detach().to("cpu").contiguous().clone() for p in model.parameters()]
    for s, part in enumerate(parts):
        for dst, src in zip(plan.views(dense, s), part, strict=True):
            dst.copy_(src)
    with torch.no_grad():
        for p, c in zip(model.parameters(), dense, strict=True):
            p.copy_(c)


class _Stage:
    """What one attempt of the stage runs: task ``s < K`` serves key range ``s``, task ``K + w``
    trains as worker ``w``. Pickled into every task (the model's pieces travel in ``spec``)."""

    def __init__(
        self,
        spec: FitSpec,
        strategy: AsyncParameterServer,
        plan: ShardPlan,
        workers: int,
        job: JobConfig,
        policy: CheckpointPolicy | None,
        secret: bytes,
        fault: Fault | None,
    ) -> None:
        self.spec, self.strategy, self.plan, self.workers = spec, strategy, plan, workers
        self.threads, self.start_timeout_s = job.scaling.threads, job.failures.start_timeout_s
        self.every_s = job.checkpoints.checkpoint_every_s or 60.0
        self.policy, self.secret, self.fault = policy, secret, fault
        self.options = TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls)

    def run(self, spark: Any, load: list[bytes | None]) -> list[Any]:
        from ..spark.launcher import run_barrier

        servers = self.plan.num_shards
        first, last = self.spec.part.start_epoch + 1, self.spec.part.start_epoch + self.spec.epochs
        description = (
            f"sparkdp async {self.strategy.rule}: {servers} servers and {self.workers} workers, "
            f"epochs {first}-{last}"
        )
        return run_barrier(
            lambda info: self.task(info.rank, load),
            servers + self.workers,
            spark=spark,
            start_timeout_s=self.start_timeout_s,
            description=description,
            store=False,
        )

    def task(self, rank: int, load: list[bytes | None]) -> Any:
        servers = self.plan.num_shards
        return self.serve(rank, load[rank]) if rank < servers else self.work(rank - servers)

    def serve(self, shard: int, state: bytes | None) -> dict[str, Any]:
        from ..spark.task import all_gather, stage_barrier, task_host

        servers = self.plan.num_shards
        server = server_factory(self.strategy, self.workers)(_pieces(self.plan, self.spec.model, shard))
        if state is not None:
            server.load_state_dict(state_io.from_bytes(state))
        saver = (
            ServerCheckpoints(server, self.policy.store(), self.every_s, server_series(shard, servers))
            if self.policy is not None
            else None
        )
        with (
            TcpTransport(self.options).serve(
                server, host=task_host(), port=0, secret=self.secret
            ) as endpoint,
            saver or contextlib.nullcontext(),
            _killer(self.fault, shard, server),
            _reporting(self.spec.monitor, self.workers + shard, shard, server),
        ):
            all_gather(json.dumps({"address": endpoint.info.address, "cert": endpoint.info.tls_cert}))
            stage_barrier()  # every worker is done
        if saver is not None:
            saver.save()
        pulled: Pulled = server.pull(worker=self.workers, observe=True)  # an id no worker has
        return {"shard": shard, "host": socket.gethostname(), "centre": pulled.tensors, **server.metrics()}

    def work(self, worker: int) -> WorkerReport:
        from ..spark.task import all_gather, stage_barrier

        servers = [json.loads(m) for m in all_gather("")[: self.plan.num_shards]]
        info = ShardedInfo(
            tuple(s["address"] for s in servers), self.secret, tuple(s["cert"] for s in servers)
        )
        transport = ShardedTransport(TcpTransport(self.options), self.plan)
        strategy = copy.copy(self.strategy).connect_to(transport, info)
        fault = self.fault if self.fault is not None and self.fault.action != "kill-server" else None
        report = fit_worker(
            replace(self.spec, strategy=strategy, fault=fault),
            task_collective(worker, self.workers, self.threads),
        )
        assert report is not None  # an asynchronous worker returns its own report
        stage_barrier()  # the servers stop once every worker is here
        return report


@contextlib.contextmanager
def _reporting(link: MonitorLink | None, ident: int, shard: int, server: ParameterServer):
    """Send the live monitor a ``server`` record (this server's pushes, pulls, bytes and
    staleness so far) every ``link.interval_s``, as id ``ident`` (one no worker has)."""
    client = None
    if link is not None:
        try:
            client = TcpTransport().connect(
                link.info.address, link.info.secret, ident, timeout=10.0, tls_cert=link.info.tls_cert
            )
        except Exception as exc:  # monitoring must not fail the job
            log.warning(
                "server %d: live monitoring is off, the driver's monitor is unreachable: %s", shard, exc
            )
    if client is None:
        yield
        return
    every_s = cast(MonitorLink, link).interval_s

    def report(done: threading.Event) -> None:
        try:
            while True:
                last = done.wait(every_s)  # a last record once the workers are done
                client.report(
                    {
                        "type": "server",
                        "shard": shard,
                        "host": socket.gethostname(),
                        "time": time.time(),
                        **server.metrics(),
                    }
                )
                if last:
                    return
        except Exception as exc:
            log.warning("server %d: live monitoring stopped: %s", shard, exc)

    try:
        with _beside(report, "sparkdp-server-monitor"):
            yield
    finally:
        client.close()


@contextlib.contextmanager
def _killer(fault: Fault | None, shard: int, server: ParameterServer):
    """``SPARKDP_FAULT=kill-server:rank=S:step=P``: server ``S`` kills its own process once it
    has applied ``P`` pushes, as a lost executor would."""
    if fault is None or fault.action != "kill-server" or fault.rank != shard:
        yield
        return

    def watch(done: threading.Event) -> None:
        while not done.wait(0.05):
            if server.metrics()["pushes_applied"] >= fault.step:
                log.warning("fault injected: server %d kills its task after %d pushes", shard, fault.step)
                os.kill(os.getpid(), signal.SIGKILL)

    with _beside(watch, "sparkdp-fault"):
        yield


@contextlib.contextmanager
def _beside(run: Callable[[threading.Event], None], name: str):
    """``run(done)`` on a thread for the length of the ``with`` block; ``done`` is set at its end
    and the thread joined."""
    done = threading.Event()
    thread = threading.Thread(target=run, args=(done,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
