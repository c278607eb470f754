"""The driver-server kind: an asynchronous job's parameter server in this process, its workers
ordinary Spark tasks around it (``sparkdp.fit`` and ``sparkdp.run`` / ``launch`` alike).

The server outlives a failed attempt (it runs here), so a restart continues from its current
centre: the restarted tasks pull it, continue their push sequence numbers and train the epochs
the server's applied pushes do not cover, on the task slots left when ``min_workers`` allows.
With a checkpoint directory a thread saves the server's state every ``checkpoint_every_s``
(``ps-NNNNNN-{job}.safetensors``) and ``resume`` starts from this job's newest one.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch

from ...comm.base import Collective
from ...config import JobConfig
from ...errors import ConfigError
from ...ps import ParameterServer
from ...ps.transport import TcpOptions, TcpTransport
from ...strategies.async_ps import AsyncParameterServer
from ...strategies.base import Strategy
from ...train.checkpoint_manager import CheckpointManager
from ...train.checkpoint_store import new_job_id, parse_name, position_key
from ...train.faults import fault_from_env
from ...train.loop import FitSpec, fit_worker
from ...train.report import WorkerReport
from ...train.result import TrainResult
from ..async_job import (
    async_result,
    epochs_done,
    refuse_spark_retry,
    remaining,
    server_factory,
    task_collective,
)
from ..controller import Attempt
from ..recovery import refuse_foreign_checkpoints, resumed_job
from .base import Body, JobRun

log = logging.getLogger(__name__)


class DriverServer:
    """Ordinary Spark tasks around a parameter server on the driver (a restarted task pulls the
    current centre and continues its sequence numbers)."""

    label = "asynchronous Spark workers"

    def fit(self, spec: FitSpec, run: JobRun) -> TrainResult:
        lineage = server_lineage(run.job)  # a resumed job keeps the identity of the checkpoints it resumes
        refuse_foreign_checkpoints(run.job, lineage)
        return fit_async(spec, run, job_id=lineage)

    def call(self, body: Body, strategy: Strategy, run: JobRun, description: str) -> Any:
        return run_async(
            lambda _w, collective, shipped, attempt: body(collective, shipped, attempt),
            cast(AsyncParameterServer, strategy),  # a Launcher.TASKS strategy
            run,
            description,
        )[0]


def fit_async(spec: FitSpec, run: JobRun, job_id: str | None = None) -> TrainResult:
    """Start the server on the driver, run the workers' tasks; the model becomes the centre.
    ``job_id``: the identity of the server checkpoints (a resumed job's: those it resumes)."""
    from ...spark.cluster import available_slots, driver_host

    job, workers = run.job, run.workers
    model, strategy = spec.model, cast(AsyncParameterServer, spec.strategy)  # Launcher.TASKS: this strategy's
    server = server_factory(strategy, workers)(list(model.parameters()))
    whole = spec  # the job from its first epoch: the server's sequence numbers count from there
    manager = server_manager(job, job_id or new_job_id())
    if job.checkpoints.resume is not None:
        assert manager is not None  # the resume directory at least
        spec = resume_server(server, spec, strategy, workers, resume_manager(job, manager))
    if run.hub is not None:  # the live display shows the server's pushes and staleness
        run.hub.server_metrics = server.metrics
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    every_s = job.checkpoints.checkpoint_every_s or 60.0
    saver = manager.server_saver(server, every_s) if manager is not None else None
    controller = run.controller(lambda: available_slots(run.spark))
    with (
        transport.serve(server, host=driver_host(run.spark), port=0) as endpoint,
        saver or contextlib.nullcontext(),
    ):
        info = endpoint.info
        log.info(
            "parameter server for %s on %s with %d shard(s)", strategy.rule, info.address, server.num_shards
        )
        # (sparkdp.fit checked before the job that executors reach this process, or moved the server)
        shipped = copy.copy(strategy).connect_to(transport, info)
        plan = ServerAttempts(whole, spec, shipped, server, run)
        reports: list[WorkerReport] = controller.run(plan)
    if saver is not None:
        saver.save()  # the finished job: a later resume has nothing left to do
    centre_from_server(server, model, workers)
    details = controller.record({"server": server.metrics()})
    return async_result(plan.spec, reports, controller.now, run.started, details)


class ServerAttempts:
    """The controller's plan for a parameter server on the driver: the server outlives a failed
    attempt (it runs in this process), so a restart continues from its current state, running
    the epochs its applied pushes do not cover on the workers the controller says."""

    def __init__(
        self,
        whole: FitSpec,
        spec: FitSpec,
        shipped: AsyncParameterServer,
        server: ParameterServer,
        run: JobRun,
    ) -> None:
        self.whole, self.spec, self.shipped, self.server, self.run = whole, spec, shipped, server, run
        self.first = replace(spec, strategy=shipped, fault=fault_from_env())

    def attempt(self, attempt: Attempt) -> list[WorkerReport]:
        from ...spark.launcher import run_tasks

        strategy, workers, threads = self.shipped, attempt.workers, self.run.job.scaling.threads
        if attempt.restart:  # the epochs the server's applied pushes do not cover; the fault fired
            self.spec = remaining(
                self.whole, epochs_done(self.server.last_seq, self.whole, strategy, workers)
            )
        this = self.first if attempt.restart == 0 else replace(self.spec, strategy=strategy, fault=None)

        def task(worker: int) -> WorkerReport:
            refuse_spark_retry(worker)
            report = fit_worker(this, task_collective(worker, workers, threads))
            assert report is not None  # an asynchronous (Launcher.TASKS) worker returns its own report
            return report

        if not this.epochs:
            return []
        return run_tasks(
            task,
            workers,
            spark=self.run.spark,
            description=f"sparkdp async {strategy.rule}",
            start_timeout_s=self.run.job.failures.start_timeout_s,
        )

    def restart_point(self) -> str:
        return "the parameter server's current centre"


class AroundServer:
    """The plan of ``sparkdp.run`` / ``launch`` around a server on the driver: every attempt runs
    the workers' code from its start, against the server's current centre."""

    def __init__(self, attempt: Callable[[Attempt], Any]) -> None:
        self.attempt = attempt

    def restart_point(self) -> str:
        return "the parameter server's current centre"


def run_async(
    call: Callable[[int, Collective, AsyncParameterServer, Attempt], Any],
    strategy: AsyncParameterServer,
    run: JobRun,
    description: str,
) -> list[Any]:
    """``sparkdp.run`` / ``launch`` with an asynchronous strategy: ``call(worker, collective, strategy,
    attempt)`` on the job's ordinary Spark tasks, around a parameter server on the driver whose
    centre is the first worker's model (the model is built inside the user's function, so the
    driver has none to start from; ``TcpTransport.serve(initial=...)``). A failed attempt runs
    again as the job's restart policy allows, the server keeping its centre. Returns the results
    by worker."""
    from ...spark.cluster import available_slots, driver_host, executors_may_not_reach_us
    from ...spark.launcher import check_reachable, run_tasks

    if "epoch" in (strategy.push_every, strategy.pull_every):
        raise ConfigError(
            "push_every / pull_every = 'epoch' needs the epochs of sparkdp.fit's own loop; in your "
            "own loop (sparkdp.run, sparkdp launch) give a number of batches instead."
        )
    spark, threads, start_timeout_s = run.spark, run.job.scaling.threads, run.job.failures.start_timeout_s
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    with transport.serve(
        None, host=driver_host(spark), port=0, initial=server_factory(strategy, run.workers)
    ) as endpoint:
        if run.hub is not None:
            run.hub.server_metrics = lambda: endpoint.server.metrics() if endpoint.server is not None else {}
        shipped = copy.copy(strategy).connect_to(transport, endpoint.info, offer_centre=True)
        if executors_may_not_reach_us(spark):
            # Where executors may run on other machines, a few seconds' check that they can connect
            # to the server before the tasks start (each would otherwise wait out its own connect timeout).
            check_reachable(spark, endpoint.info.address, start_timeout_s=start_timeout_s)

        def run_attempt(attempt: Attempt) -> list[Any]:
            def task(worker: int) -> Any:
                refuse_spark_retry(worker)
                return call(worker, task_collective(worker, attempt.workers, threads), shipped, attempt)

            return run_tasks(
                task, attempt.workers, spark=spark, description=description, start_timeout_s=start_timeout_s
            )

        results: list[Any] = run.controller(lambda: available_slots(spark)).run(AroundServer(run_attempt))
        server = endpoint.server
    if server is not None and run.hub is not None:  # its totals, once the connections are closed
        run.hub.server_metrics = server.metrics
    if server is not None:
        log.info("parameter server: %s", {k: v for k, v in server.metrics().items() if k != "staleness"})
    return results


def server_manager(job: JobConfig, job_id: str) -> CheckpointManager | None:
    """The manager of the job's server checkpoints, in ``checkpoint_dir`` (else the ``resume``
    directory); None when the job has neither."""
    directory = job.checkpoints.checkpoint_dir or job.checkpoints.resume
    if directory is None:
        return None
    manager = CheckpointManager.of(replace(job.checkpoints, checkpoint_dir=str(directory)), job_id)
    manager.check_writable()
    return manager


def resume_manager(job: JobConfig, writer: CheckpointManager) -> CheckpointManager:
    """The manager that reads the server checkpoints ``resume=`` names: the writer's own when the
    job writes where it resumes, else one over the resume directory with the writer's identity."""
    if writer.directory == str(job.checkpoints.resume):
        return writer
    return CheckpointManager(
        str(job.checkpoints.resume), writer.job_id, storage_options=job.checkpoints.checkpoint_storage_options
    )


def server_lineage(job: JobConfig) -> str | None:
    """The identity of the job whose newest server checkpoint ``resume=`` names (None without resume):
    a resumed asynchronous job continues that job's checkpoints."""
    if job.checkpoints.resume is None:
        return None
    reader = CheckpointManager.reader(str(job.checkpoints.resume), job.checkpoints.checkpoint_storage_options)
    servers = [
        p for p in (parse_name(n) for n in reader.names()) if p is not None and p.series.startswith("ps")
    ]
    chosen = resumed_job(job, {p.series for p in servers})
    newest = max(
        (p for p in servers if p.job_id == chosen), key=lambda p: position_key(p.position), default=None
    )
    if newest is None:
        raise ConfigError(
            f"resume={job.checkpoints.resume!r}: no parameter-server checkpoint (ps-*.safetensors) "
            "there. Point resume at the checkpoint_dir of an earlier asynchronous run, or leave it "
            "unset to start afresh."
        )
    log.info("resuming job %s from its server checkpoints in %s", newest.job_id, job.checkpoints.resume)
    return newest.job_id


def resume_server(
    server: ParameterServer,
    spec: FitSpec,
    strategy: AsyncParameterServer,
    workers: int,
    manager: CheckpointManager,
) -> FitSpec:
    """Load this job's newest readable server checkpoint; return ``spec`` for the epochs still to run."""
    name = manager.load_server(server)
    centre_from_server(server, spec.model, workers)
    done = epochs_done(server.last_seq, spec, strategy, workers)
    log.info(
        "resuming the parameter server from %s: %d of %d epoch(s) covered by the applied pushes",
        name,
        done,
        spec.epochs,
    )
    return remaining(spec, done)


def centre_from_server(server: ParameterServer, model: torch.nn.Module, workers: int) -> None:
    """The server's centre into ``model``, pulled as worker ``workers``: an id no task uses, so no
    task's bookkeeping moves."""
    with torch.no_grad():
        for p, c in zip(model.parameters(), server.pull(worker=workers).tensors, strict=True):
            p.copy_(c)


__all__ = ["AroundServer", "DriverServer", "ServerAttempts", "fit_async", "run_async", "server_lineage"]
