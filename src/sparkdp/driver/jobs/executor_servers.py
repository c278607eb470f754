"""The executor-servers kind: an asynchronous job's parameter servers as Spark tasks beside its
workers, one barrier stage of ``K + workers`` tasks (driver/server_tasks.py runs the tasks).

The kind is chosen where the job starts: when the strategy declares ``servers=K``, or with one
server when the executors cannot reach the driver. A failed attempt (server or worker) restarts
from every server's newest checkpoint of this job, on the task slots left beside the servers
when ``min_workers`` allows.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import replace
from typing import Any, cast

import torch

from ... import state as state_io
from ...errors import ConfigError
from ...ps import ParameterServer
from ...ps.auth import new_secret
from ...ps.sharding import ShardPlan
from ...strategies.async_ps import AsyncParameterServer
from ...strategies.base import Strategy
from ...train.checkpoint import CheckpointPolicy
from ...train.checkpoint_manager import CheckpointManager
from ...train.checkpoint_store import new_job_id, server_series
from ...train.faults import fault_from_env
from ...train.loop import FitSpec
from ...train.result import TrainResult
from ..async_job import async_result, epochs_done, remaining, server_factory
from ..controller import Attempt
from ..recovery import refuse_foreign_checkpoints
from ..server_tasks import ServerStage, combined, shard_pieces
from .base import Body, JobRun
from .driver_server import server_lineage

log = logging.getLogger(__name__)


class ExecutorServers:
    """``servers`` parameter servers as Spark tasks on the executors, beside the workers."""

    label = "asynchronous Spark workers"

    def __init__(self, servers: int) -> None:
        self.servers = servers

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        lineage = server_lineage(run.job)  # a resumed job keeps the identity of the checkpoints it resumes
        refuse_foreign_checkpoints(run.job, lineage)
        return fit_on_executors(spec, run, self.servers, job_id=lineage)

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        raise ConfigError(
            "servers=K (parameter servers on the executors) trains through sparkdp.fit and "
            "`sparkdp train`; sparkdp.run and `sparkdp launch` use the server on the driver: "
            "leave servers unset."
        )


def fit_on_executors(spec: FitSpec, run: JobRun, servers: int, job_id: str | None = None) -> TrainResult:
    """Train with ``servers`` server tasks beside the job's worker tasks (``spec``: the whole job,
    from its first epoch; ``job_id``: the identity of the servers' checkpoints, a resumed job's
    those it resumes)."""
    from ...spark.cluster import available_slots, on_driver_machine

    job, workers, hub = run.job, run.workers, run.hub
    strategy = cast(AsyncParameterServer, spec.strategy)
    centre = [p.detach().to("cpu").contiguous() for p in spec.model.parameters()]
    plan = ShardPlan.build(centre, servers)
    tasks = plan.num_shards
    if tasks < servers:
        log.warning(
            "the model splits into %d key ranges only: %d server task(s), not %d", tasks, tasks, servers
        )
    directory = job.checkpoints.checkpoint_dir or job.checkpoints.resume
    if hub is not None:  # the live display's server line, from the server tasks' own records
        hub.server_metrics = lambda: combined(list(hub.servers.values()))
    controller = run.controller(lambda: _worker_slots(available_slots(run.spark), tasks))
    with contextlib.ExitStack() as stack:
        if directory is None and on_driver_machine(run.spark):  # executors share the driver's disk
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="sparkdp-ps-"))
        whole, job_id = spec, job_id or new_job_id()
        policy = (
            CheckpointPolicy(replace(job.checkpoints, checkpoint_dir=directory), job_id)
            if directory is not None
            else None
        )
        if policy is not None:
            policy.manager().check_writable()
        load: list[bytes | None] = [None] * tasks
        if job.checkpoints.resume is not None:
            resume = CheckpointPolicy(
                replace(job.checkpoints, checkpoint_dir=str(job.checkpoints.resume)), job_id
            )
            spec, load = servers_resumed(whole, strategy, plan, workers, resume.manager(), required=True)
        stage = ServerStage(spec, strategy, plan, workers, job, policy, new_secret(), fault_from_env())
        restartable = ServerStages(stage, whole, run.spark, load)
        results = controller.run(restartable)
        spec, load = stage.spec, restartable.load
    shards, reports = results[:tasks], results[tasks:]  # by rank: the servers, then the workers
    if shards:
        centre_from_parts(plan, [s["centre"] for s in shards], spec.model)
    elif all(state is not None for state in load):  # resumed with nothing left to train: the saved centre
        saved = [state_io.from_bytes(cast(bytes, state))["center"] for state in load]
        centre_from_parts(plan, saved, spec.model)
    metrics = [{k: v for k, v in s.items() if k != "centre"} for s in shards]
    details = controller.record({"server": combined(metrics), "servers": metrics})
    return async_result(spec, reports, controller.now, run.started, details)


class ServerStages:
    """The controller's plan for servers on the executors: a restart continues from every
    server's newest checkpoint, on the workers the controller says."""

    def __init__(self, stage: ServerStage, whole: FitSpec, spark: Any, load: list[bytes | None]) -> None:
        self.stage, self.whole, self.spark, self.load = stage, whole, spark, load

    def attempt(self, attempt: Attempt) -> list[Any]:
        stage = self.stage
        if attempt.restart:
            stage.workers = attempt.workers
            assert stage.policy is not None  # restart_point gave no restart otherwise
            stage.spec, self.load = servers_resumed(
                self.whole,
                stage.strategy,
                stage.plan,
                attempt.workers,
                stage.policy.manager(),
                required=False,
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


def servers_resumed(
    spec: FitSpec,
    strategy: AsyncParameterServer,
    plan: ShardPlan,
    workers: int,
    manager: CheckpointManager,
    *,
    required: bool,
) -> tuple[FitSpec, list[bytes | None]]:
    """The state of every server's newest readable checkpoint of this job (``manager.job_id``)
    and ``spec`` for the epochs they do not cover; a server without one starts from ``spec``'s
    model (``required``: refuse). The states travel to the server tasks themselves: a task of the
    failed attempt that Spark has not stopped yet may still save and prune the files."""
    names: list[str | None] = []
    books: list[ParameterServer | None] = []
    for s in range(plan.num_shards):
        server = server_factory(strategy, workers)(shard_pieces(plan, spec.model, s))
        series = server_series(s, plan.num_shards)
        try:
            names.append(manager.load_server(server, series))
            books.append(server)
        except ConfigError:
            if required or manager.names(series, manager.job_id):
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


def centre_from_parts(plan: ShardPlan, parts: list[list[torch.Tensor]], model: torch.nn.Module) -> None:
    """Every server's part of the centre (``parts``, by key range) into ``model``."""
    dense = [p.detach().to("cpu").contiguous().clone() for p in model.parameters()]
    for s, part in enumerate(parts):
        for dst, src in zip(plan.views(dense, s), part, strict=True):
            dst.copy_(src)
    with torch.no_grad():
        for p, c in zip(model.parameters(), dense, strict=True):
            p.copy_(c)


__all__ = ["ExecutorServers", "ServerStages", "fit_on_executors", "servers_resumed"]
