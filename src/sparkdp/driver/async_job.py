"""The driver side of asynchronous training: the parameter server, independent Spark tasks.

With a checkpoint directory the server's state (``ParameterServer.state_dict``) is saved
periodically through the job's checkpoint store as ``ps-NNNNNN-{job}.safetensors`` (the
``servers=K`` tasks' as ``ps-sKofN-NNNNNN-{job}``), and ``resume`` restarts from it: see
docs/guide/reliability.md, Automatic recovery.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import torch

from ..comm.single import IndependentCollective, SingleProcessCollective
from ..config import JobConfig
from ..errors import ConfigError, WorkerLost
from ..ps import ParameterServer
from ..ps.transport import TcpOptions, TcpTransport
from ..strategies.async_ps import AsyncParameterServer
from ..train.checkpoint_store import (
    CheckpointName,
    CheckpointStore,
    new_job_id,
    parse_name,
    position_key,
    server_series,
)
from ..train.children import job_worker_ids
from ..train.faults import fault_from_env
from ..train.jobs import task_device
from ..train.loop import FitSpec, evaluate, fit_worker
from ..train.report import WorkerReport
from ..train.result import TrainResult
from .controller import Attempt, Controller, RestartPolicy
from .recovery import resumed_job

log = logging.getLogger(__name__)


def fit_async(
    spec: FitSpec,
    job: JobConfig,
    *,
    workers: int,
    spark: Any,
    started: float,
    hub: Any = None,
    job_id: str | None = None,
) -> TrainResult:
    """Start the server on the driver, run ``workers`` tasks; the model becomes the centre.
    ``job_id``: the identity of the server checkpoints (a resumed job's: those it resumes)."""
    from ..spark.cluster import driver_host
    from ..spark.launcher import run_tasks

    model, strategy = spec.model, cast(AsyncParameterServer, spec.strategy)  # Launcher.TASKS: this strategy's
    threads, checkpoint_dir, resume, start_timeout_s = (
        job.scaling.threads,
        job.checkpoints.checkpoint_dir,
        job.checkpoints.resume,
        job.failures.start_timeout_s,
    )
    server = server_factory(strategy, workers)(list(model.parameters()))
    whole = spec  # the job from its first epoch: the server's sequence numbers count from there
    saver_dir = checkpoint_dir or resume
    store = server_store(job, saver_dir, job_id or new_job_id()) if saver_dir else None
    if resume is not None:
        assert store is not None  # saver_dir is resume at least
        spec = _resume_server(
            server,
            spec,
            strategy,
            workers,
            store
            if saver_dir == resume
            else CheckpointStore(
                resume, store.job_id, storage_options=job.checkpoints.checkpoint_storage_options
            ),
        )
    if hub is not None:  # the live display shows the server's pushes and staleness
        hub.server_metrics = server.metrics
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    host = driver_host(spark)
    saver = ServerCheckpoints(server, store, job.checkpoints.checkpoint_every_s or 60.0) if store else None
    with transport.serve(server, host=host, port=0) as endpoint, saver or contextlib.nullcontext():
        info = endpoint.info
        log.info(
            "parameter server for %s on %s with %d shard(s)", strategy.rule, info.address, server.num_shards
        )
        # (sparkdp.fit checked before the job that executors reach this process, or moved the server)
        shipped = copy.copy(strategy).connect_to(transport, info)
        first = replace(spec, strategy=shipped, fault=fault_from_env())
        restarts = RestartPolicy.of(job)

        def run_attempt(attempt: Attempt) -> list[WorkerReport]:
            nonlocal spec
            if attempt.restart:  # the epochs the server's applied pushes do not cover; the fault fired
                spec = remaining(whole, epochs_done(server.last_seq, whole, strategy, workers))
            this = first if attempt.restart == 0 else replace(spec, strategy=shipped, fault=None)

            def task(worker: int) -> WorkerReport:
                refuse_spark_retry(worker)
                report = fit_worker(this, task_collective(worker, workers, threads))
                assert report is not None  # an asynchronous (Launcher.TASKS) worker returns its own report
                return report

            return (
                run_tasks(
                    task,
                    workers,
                    spark=spark,
                    description=f"sparkdp async {strategy.rule}",
                    start_timeout_s=start_timeout_s,
                )
                if this.epochs
                else []
            )

        reports: list[WorkerReport] = Controller(restarts, workers).run(ServerPlan(run_attempt))
    if saver is not None:
        saver.save()  # the finished job: a later resume has nothing left to do
    _copy_centre(server, model, workers)
    result = async_result(spec, reports, workers, started, {"server": server.metrics()})
    result.details["restarts"] = list(restarts.failures)
    return result


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


class ServerPlan:
    """The controller's plan for a parameter server on the driver: the server outlives a failed
    attempt (it runs in this process), so a restart continues from its current state."""

    def __init__(self, run_attempt: Callable[[Attempt], Any]) -> None:
        self.attempt = run_attempt

    def restart_point(self) -> str:
        return "the parameter server's current centre"


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


def run_async(
    call: Callable[[int, Any, AsyncParameterServer, Attempt], Any],
    strategy: AsyncParameterServer,
    *,
    workers: int,
    spark: Any,
    threads: int | None,
    description: str,
    restarts: RestartPolicy,
    hub: Any = None,
    start_timeout_s: float = 60.0,
) -> list[Any]:
    """``sparkdp.run`` / ``launch`` with an asynchronous strategy: ``call(worker, collective, strategy,
    attempt)`` on ``workers`` ordinary Spark tasks, around a parameter server on the driver whose
    centre is the first worker's model (the model is built inside the user's function, so the
    driver has none to start from; ``TcpTransport.serve(initial=...)``). A failed attempt runs
    again as ``restarts`` allows, the server keeping its centre. Returns the results by worker."""
    from ..spark.cluster import driver_host, executors_may_not_reach_us
    from ..spark.launcher import check_reachable, run_tasks

    if "epoch" in (strategy.push_every, strategy.pull_every):
        raise ConfigError(
            "push_every / pull_every = 'epoch' needs the epochs of sparkdp.fit's own loop; in your "
            "own loop (sparkdp.run, sparkdp launch) give a number of batches instead."
        )
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    with transport.serve(
        None, host=driver_host(spark), port=0, initial=server_factory(strategy, workers)
    ) as endpoint:
        if hub is not None:
            hub.server_metrics = lambda: endpoint.server.metrics() if endpoint.server is not None else {}
        shipped = copy.copy(strategy).connect_to(transport, endpoint.info, offer_centre=True)
        if executors_may_not_reach_us(spark):
            # Where executors may run on other machines, a few seconds' check that they can connect
            # to the server before the tasks start (each would otherwise wait out its own connect timeout).
            check_reachable(spark, endpoint.info.address, start_timeout_s=start_timeout_s)

        def run_attempt(attempt: Attempt) -> list[Any]:
            def task(worker: int) -> Any:
                refuse_spark_retry(worker)
                return call(worker, task_collective(worker, workers, threads), shipped, attempt)

            return run_tasks(
                task, workers, spark=spark, description=description, start_timeout_s=start_timeout_s
            )

        results: list[Any] = Controller(restarts, workers).run(ServerPlan(run_attempt))
        server = endpoint.server
    if server is not None and hub is not None:  # its totals, once the connections are closed
        hub.server_metrics = server.metrics
    if server is not None:
        log.info("parameter server: %s", {k: v for k, v in server.metrics().items() if k != "staleness"})
    return results


class ServerCheckpoints:
    """Saves a server's state every ``every_s`` seconds from a thread, as ``series`` checkpoints of
    ``store`` (its job's identity on every file; the store keeps the newest ``keep_checkpoints``).
    Taking the state copies it under the server's locks; writing it happens on this thread."""

    def __init__(
        self, server: ParameterServer, store: CheckpointStore, every_s: float, series: str = server_series()
    ) -> None:
        self.server, self.store, self.every_s, self.series = server, store, every_s, series
        mine = store.names(series, store.job_id)
        last = parse_name(mine[-1]) if mine else None
        self.count = int(last.position) + 1 if last is not None else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkdp-ps-checkpoints", daemon=True)

    def __enter__(self) -> ServerCheckpoints:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.save()
            except Exception as exc:  # a full or read-only disk: training goes on, the next period retries
                log.warning(
                    "the parameter-server checkpoint %s failed (%s: %s); training goes on and the next "
                    "save is tried in %g s",
                    self.store.url(self._name()),
                    type(exc).__name__,
                    exc,
                    self.every_s,
                )

    def _name(self) -> str:
        return self.store.name(self.series, f"{self.count:06d}")

    def save(self) -> None:
        name = self.store.save(self.series, f"{self.count:06d}", self.server.state_dict())
        self.count += 1
        log.info("parameter-server checkpoint %s", self.store.url(name))


def server_store(job: JobConfig, directory: str, job_id: str) -> CheckpointStore:
    """The store of a job's server checkpoints in ``directory``."""
    store = CheckpointStore(
        directory, job_id, job.checkpoints.keep_checkpoints, job.checkpoints.checkpoint_storage_options
    )
    store.check_writable()
    return store


def server_lineage(job: JobConfig) -> str | None:
    """The identity of the job whose newest server checkpoint ``resume=`` names (None without resume):
    a resumed asynchronous job continues that job's checkpoints."""
    if job.checkpoints.resume is None:
        return None
    store = CheckpointStore(
        str(job.checkpoints.resume), "reader", storage_options=job.checkpoints.checkpoint_storage_options
    )
    servers = [cast(CheckpointName, parse_name(n)) for n in store.names() if n.startswith("ps-")]
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


def _resume_server(
    server: ParameterServer,
    spec: FitSpec,
    strategy: AsyncParameterServer,
    workers: int,
    store: CheckpointStore,
) -> FitSpec:
    """Load this job's newest readable server checkpoint; return ``spec`` for the epochs still to run."""
    name = load_latest(server, store)
    _copy_centre(server, spec.model, workers)
    done = epochs_done(server.last_seq, spec, strategy, workers)
    log.info(
        "resuming the parameter server from %s: %d of %d epoch(s) covered by the applied pushes",
        name,
        done,
        spec.epochs,
    )
    return remaining(spec, done)


def load_latest(server: ParameterServer, store: CheckpointStore, series: str = server_series()) -> str:
    """Load this job's (``store.job_id``'s) newest ``series`` checkpoint that reads and verifies into
    ``server`` and return its name; damaged newer ones are skipped with a warning, another job's
    are never read."""
    found = store.latest(series, store.job_id, lambda name, state: server.load_state_dict(state))
    if found is None:
        raise ConfigError(
            f"{store.directory!r}: no readable parameter-server checkpoint of this job "
            f"({series}-*-{store.job_id}.safetensors) there. Point resume at the checkpoint_dir "
            "of an earlier asynchronous run, or leave it unset to start afresh."
        )
    return found[0]


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


def _copy_centre(server: ParameterServer, model: torch.nn.Module, workers: int) -> None:
    """The server's centre into ``model``, pulled as worker ``workers``: an id no task uses, so no
    task's bookkeeping moves."""
    with torch.no_grad():
        for p, c in zip(model.parameters(), server.pull(worker=workers).tensors, strict=True):
            p.copy_(c)
