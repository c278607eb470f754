"""Parameter servers as Spark tasks: what the K server tasks and the workers beside them run.

One server on the driver carries ``2 * S`` bytes per worker step over the driver's one link;
from a few workers on, that link is the job's limit (``sparkdp plan`` marks it). With
``servers=K`` the job is one barrier stage of ``K + workers`` tasks: task ``s < K`` serves key
range ``s`` of a byte-balanced :class:`~sparkdp.ps.sharding.ShardPlan` on its own executor's
address, task ``K + w`` is worker ``w``, pushing and pulling every server at once
(:class:`~sparkdp.ps.transport.sharded.ShardedClient`). The job around the stage (its restarts,
resume and result) is driver/jobs/executor_servers.py's. How the addresses travel, what stays the
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
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch

from .. import state as state_io
from ..config import JobConfig
from ..monitor.probe import MonitorLink
from ..ps import ParameterServer
from ..ps.server import Pulled
from ..ps.sharding import ShardPlan
from ..ps.transport import TcpOptions, TcpTransport
from ..ps.transport.sharded import ShardedInfo, ShardedTransport
from ..strategies.async_ps import AsyncParameterServer
from ..train.checkpoint import CheckpointPolicy
from ..train.checkpoint_store import server_series
from ..train.faults import Fault
from ..train.loop import FitSpec, fit_worker
from ..train.report import WorkerReport
from .async_job import server_factory, task_collective

log = logging.getLogger(__name__)

#: counted metrics: every push and pull reaches every server, so each server counts it once
_COUNTS = ("pulls", "pushes_applied", "duplicates_dropped", "rejected")


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


def shard_pieces(plan: ShardPlan, model: torch.nn.Module, shard: int) -> list[torch.Tensor]:
    return [
        p.clone() for p in plan.views([t.detach().to("cpu").contiguous() for t in model.parameters()], shard)
    ]


class ServerStage:
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
        server = server_factory(self.strategy, self.workers)(shard_pieces(self.plan, self.spec.model, shard))
        if state is not None:
            server.load_state_dict(state_io.from_bytes(state))
        saver = (
            self.policy.manager().server_saver(server, self.every_s, server_series(shard, servers))
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
