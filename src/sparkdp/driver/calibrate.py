"""``sparkdp plan --calibrate``: measure the cost model's terms on the user's own Spark cluster.

Three short measurements, each with what training itself uses:

* **compute** ``C`` — a barrier stage of ``workers`` tasks, all running forward + backward +
  SGD steps of the model on one batch at once (so CPU sharing between co-located tasks counts,
  as it does in training), timed from a common start to the end of the slowest task's steps:
  a synchronous step waits for its slowest worker;
* **all-reduce** ``α, β`` — in the same stage, the ranks all-reduce a tiny and a model-sized
  tensor through the collective ``allreduce`` trains with (shared memory between co-located
  ranks, gloo otherwise); the two medians fix ``2(M-1)α`` and ``2(M-1)/M·β``;
* **all-gather and reduce-scatter** — in the same stage, a model-sized all-gather and
  reduce-scatter on the process group and backend the sharded strategies (fsdp, hsdp, zero1)
  run theirs on (torch.distributed's: gloo on CPUs, nccl on GPUs, never the shared-memory
  path): each over the half ring the fitted ``α, β`` price is its factor
  (``Network.all_gather_factor``, ``Network.reduce_scatter_factor``), and zero1's broadcast of
  every rank's partition of the parameters as its ``ZeroRedundancyOptimizer`` partitions them
  (``Network.broadcast_factor``);
* **hsdp's collectives**, given the workers per host ``L`` (``sparkdp plan --workers-per-host``)
  and more than one host: on the replicas × shard-group mesh hsdp trains on, in a step's order
  after a compute step, two model-sized all-gathers and a reduce-scatter within each host's
  shard group (all groups at once) and the all-reduce of one worker's 1/L of the model across
  the hosts; with a tiny all-gather, the all-gathers fit the local link ``α_local, β_local``,
  the reduce-scatter is its factor on that link, and the all-reduce's time over the ring on the
  fitted ``α, β`` is ``Network.replica_allreduce_factor`` (a host's L all-reduces share its
  link at once, and none of them runs through the shared-memory path the calibrated all-reduce
  takes);
* **parameter server** ``α_ps, β_ps`` — a server on the driver (authenticated TCP and the ASGD
  update, as in asynchronous training) and one task pushing and pulling a tiny and a
  model-sized tensor; then every task pushing at once (the rate the server's link gives many
  flows, ``β_link``), and every task cycling through the server as an asynchronous worker does
  (a compute step, a push, a pull) for a few rounds: how far beyond the link's full-duplex
  limit such rounds run is the workers' bunching ``b``.

Each figure is a median of ``reps`` timings after a warm-up.  Everything runs for a few
seconds; ``sparkdp plan`` then predicts larger worker counts from it (``costmodel.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..costmodel import Network, half_ring_s, ring_allreduce_s
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..ps.transport.base import ConnectInfo
    from ..ps.transport.tcp_client import TcpClient
    from ..spark.task import TaskInfo

log = logging.getLogger(__name__)

TINY = 256  # floats: a message whose time is all latency


@dataclass(frozen=True)
class Calibration:
    workers: int
    params: int
    batch: int
    step_compute_s: float
    allreduce_tiny_s: float | None  # None with one worker
    allreduce_full_s: float | None
    ps_tiny_s: float
    ps_full_s: float
    server_apply_s: float = 0.0  # the server applying one model-sized push (ASGD), on the driver
    #: one model-sized push of each worker while all ``workers`` push at once (None: one worker)
    ps_shared_s: float | None = None
    #: one round (compute step, push, pull) of each worker while all ``workers`` cycle through the
    #: server from a common start, as training's do (None: one worker)
    ps_rounds_s: float | None = None
    #: a model-sized all-gather and reduce-scatter on torch.distributed's process group, what
    #: fsdp, hsdp and zero1 communicate through (None: one worker)
    all_gather_s: float | None = None
    reduce_scatter_s: float | None = None
    #: zero1's broadcast of every rank's partition of the parameters (None: one worker)
    partition_broadcast_s: float | None = None
    #: hsdp's collectives on its mesh of hosts of ``per_host`` workers (None: not measured, one
    #: host): within a host's shard group a tiny and a model-sized all-gather and a model-sized
    #: reduce-scatter; across the hosts the all-reduce of one worker's 1/``per_host`` of the model
    per_host: int | None = None
    local_all_gather_tiny_s: float | None = None
    local_all_gather_s: float | None = None
    local_reduce_scatter_s: float | None = None
    replica_allreduce_s: float | None = None

    def network(self) -> Network:
        """α, β from the two all-reduce points; α_ps, β_ps from the two push+pull points; the
        sharded strategies' collectives as multiples of the half ring those α, β price; hsdp's
        local link from its two all-gather points (:meth:`_hsdp_terms`)."""
        s = self.params * 4
        ps_beta = max((self.ps_full_s - self.ps_tiny_s) / (2 * (s - TINY * 4)), 1e-15)
        ps_alpha = max(self.ps_tiny_s / 2 - TINY * 4 * ps_beta, 0.0)
        sigma = self.server_apply_s / s
        # all workers pushing at once: the server's link carries workers·S at the rate those
        # flows together get
        shared = (
            max(self.ps_shared_s / (self.workers * s), ps_beta)
            if self.ps_shared_s is not None and self.workers > 1
            else None
        )
        bunching = self._bunching(ps_alpha, s * ((shared or ps_beta) + sigma), s * (shared or ps_beta))
        if self.allreduce_full_s is None or self.allreduce_tiny_s is None or self.workers < 2:
            # no all-reduce measured: the PS link
            return Network(ps_alpha, ps_beta, ps_alpha, ps_beta, sigma, shared, bunching)
        m = self.workers
        beta = max(
            (self.allreduce_full_s - self.allreduce_tiny_s) / (2 * (m - 1) / m * (s - TINY * 4)), 1e-15
        )
        alpha = max((self.allreduce_tiny_s - 2 * (m - 1) / m * TINY * 4 * beta) / (2 * (m - 1)), 0.0)
        net = Network(alpha, beta, ps_alpha, ps_beta, sigma, shared, bunching)
        half = half_ring_s(s, m, net)  # what the ring model prices either collective at
        measured = {
            "all_gather_factor": self.all_gather_s,
            "reduce_scatter_factor": self.reduce_scatter_s,
            "broadcast_factor": self.partition_broadcast_s,
        }
        net = dataclasses.replace(net, **{k: t / half for k, t in measured.items() if t is not None})
        return dataclasses.replace(net, **self._hsdp_terms(net))

    def _hsdp_terms(self, net: Network) -> dict[str, float]:
        """The local link fitted as the all-reduce's link is, from the two all-gathers within a
        shard group of ``L``: the half ring ``(L-1)α_local + (L-1)/L·S·β_local`` through both points
        (so its all-gather factor is 1); the reduce-scatter over that half ring; the all-reduce
        across the ``M/L`` hosts over the ring on ``net``. Empty when hsdp's were not measured."""
        tiny, full = self.local_all_gather_tiny_s, self.local_all_gather_s
        scatter, across = self.local_reduce_scatter_s, self.replica_allreduce_s
        if self.per_host is None or tiny is None or full is None or scatter is None or across is None:
            return {}
        local, hosts, s = self.per_host, self.workers // self.per_host, self.params * 4
        tiny_bytes = TINY // local * local * 4  # what _hsdp_collectives gathers
        share = (local - 1) / local
        beta = max((full - tiny) / (share * (s - tiny_bytes)), 1e-15)
        alpha = max((tiny - share * tiny_bytes * beta) / (local - 1), 0.0)
        local_net = Network(alpha, beta)
        return {
            "local_latency_s": alpha,
            "local_seconds_per_byte": beta,
            "local_all_gather_factor": 1.0,
            "local_reduce_scatter_factor": scatter / half_ring_s(s, local, local_net),
            "replica_allreduce_factor": across / ring_allreduce_s(s / local, hosts, net),
        }

    def _bunching(self, ps_alpha: float, in_s: float, out_s: float) -> float:
        """``b`` from the measured rounds: ``rounds = (1 + b)·M·max(in, out)`` when the server's
        link paces them. Rounds that the link does not pace (it is busy less than half of a
        worker's own round) say nothing of how the workers bunch: 0, mean-value analysis alone."""
        if self.ps_rounds_s is None or self.workers < 2:
            return 0.0
        link = self.workers * max(in_s, out_s)
        if link < (self.step_compute_s + 2 * ps_alpha + in_s + out_s) / 2:
            return 0.0
        return min(max(self.ps_rounds_s / link - 1.0, 0.0), 1.0)

    def as_dict(self) -> dict[str, Any]:
        net = self.network()
        return {
            **self.__dict__,
            "alpha_s": net.latency_s,
            "beta_s_per_byte": net.seconds_per_byte,
            "ps_alpha_s": net.ps_alpha,
            "ps_beta_s_per_byte": net.ps_beta,
            "ps_shared_beta_s_per_byte": net.ps_link_beta,
            "all_gather_factor": net.all_gather_factor,
            "reduce_scatter_factor": net.reduce_scatter_factor,
            "broadcast_factor": net.broadcast_factor,
            **self._hsdp_terms(net),  # hsdp's local link and factors, where measured
        }


def _median_time(fn, reps: int, before=lambda: None) -> float:
    """Median time of ``fn`` over ``reps`` runs after one warm-up (allocations, page faults, lazy
    initialisation). ``before`` runs untimed ahead of each: timing a collective after a compute step
    makes it also wait for the rank whose compute ran longest, as a step's communication does."""
    times = []
    for _ in range(reps + 1):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _paced_compute_s(step, reps: int, collective) -> float:  # noqa: ANN001
    """One compute step's time with every task computing at once, at the pace of the slowest:
    ``reps`` steps from a common start to the end of the last task's, over ``reps`` (after a
    warm-up). A synchronous step ends when its slowest worker's compute has, and co-located
    tasks do not always share their cores evenly: the OS may run two of four ahead and two
    behind, each at a whole core's speed, when each task's own median would be a lone step."""
    step()
    collective.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    collective.barrier()
    return (time.perf_counter() - start) / reps


def _compute_step(model: nn.Module, batch: int, sample_shape: tuple[int, ...]):
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # training's default optimizer
    x, y = torch.randn(batch, *sample_shape), torch.randint(0, 10, (batch,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def _stage_task(
    model: nn.Module,
    batch: int,
    sample_shape: tuple[int, ...],
    reps: int,
    threads: int | None,
    shared_memory: bool,
    per_host: int | None = None,
):
    def body(collective) -> dict[str, float]:
        from ..comm.shm import SharedMemoryCollective, SharedMemoryReducer
        from ..strategies.allreduce import SHARED_MEMORY_MIN_BYTES

        params = sum(p.numel() for p in model.parameters())
        step = _compute_step(model, batch, sample_shape)
        out = {"compute": _paced_compute_s(step, reps, collective)}
        if collective.world_size > 1:
            reducer = (
                SharedMemoryReducer.connect(collective, slot_bytes=min(16 << 20, params * 4))
                if shared_memory
                else None
            )
            coll = (
                SharedMemoryCollective(collective, reducer, SHARED_MEMORY_MIN_BYTES)
                if reducer
                else collective
            )
            for name, n in (("tiny", TINY), ("full", params)):
                t = torch.ones(n)
                collective.barrier()
                out[name] = _median_time(lambda t=t: coll.all_reduce(t), reps, before=step)
            out.update(_sharded_collectives(params, collective, reps, step))
            out.update(_zero_broadcast(model, collective, reps, step))
            out.update(_hsdp_collectives(params, collective, reps, step, per_host))
        return out

    from ..train.jobs import in_task

    return in_task(body, threads=threads, pg_timeout_s=120.0)


def _sharded_collectives(params: int, collective, reps: int, step) -> dict[str, float]:  # noqa: ANN001
    """Median times of a model-sized all-gather and reduce-scatter on torch.distributed's default
    process group, the one FSDP2 and ZeroRedundancyOptimizer use (gloo on CPUs, nccl on GPUs),
    each after a compute step as a training step's are. Empty without a process group."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    all_gather, reduce_scatter, _ = _fsdp_calls(collective.device)
    world = collective.world_size
    shard = torch.ones(max(1, params // world), device=collective.device)
    whole = torch.ones(shard.numel() * world, device=collective.device)
    return {
        "all_gather": _timed_after_step(lambda: all_gather(whole, shard), collective, reps, step),
        "reduce_scatter": _timed_after_step(lambda: reduce_scatter(shard, whole), collective, reps, step),
    }


def _fsdp_calls(device: torch.device):
    """FSDP2's all-gather and reduce-scatter (older torch names them all_gather_into_tensor and
    reduce_scatter_tensor), and what waits for a call on ``device`` to end (nccl returns before
    it has)."""
    import torch.distributed as dist

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return all_gather, reduce_scatter, sync


def _timed_after_step(call, collective, reps: int, step) -> float:  # noqa: ANN001
    """Median time of the collective ``call`` to its end, each after a compute step, the ranks
    starting from a barrier."""
    sync = _fsdp_calls(collective.device)[2]

    def run() -> None:
        call()
        sync()

    collective.barrier()
    return _median_time(run, reps, before=step)


def _zero_broadcast(model: nn.Module, collective, reps: int, step) -> dict[str, float]:  # noqa: ANN001
    """Median time of zero1's parameter broadcast after a compute step: PyTorch's
    ``ZeroRedundancyOptimizer`` partitions the model's parameters as ``strategies/zero.py``'s
    does (by size, largest first, to the least-loaded rank) and every rank broadcasts its
    partition, as after each of zero1's optimizer steps. Empty without a process group."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if not dist.is_initialized():
        return {}
    zero = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.SGD, lr=1e-3)
    # what zero1's step hook calls
    broadcast = zero._sync_params  # type: ignore[attr-defined]
    return {"partition_broadcast": _timed_after_step(broadcast, collective, reps, step)}


def _hsdp_collectives(params: int, collective, reps: int, step, per_host: int | None) -> dict[str, float]:  # noqa: ANN001
    """Median times of hsdp's collectives on the mesh it trains on (:meth:`HSDP.device_mesh`,
    shard groups of ``per_host``), in a step's order after a compute step: within every shard
    group at once two model-sized all-gathers (the forward's and the backward's) and a
    reduce-scatter, then across the groups the all-reduce of one worker's 1/``per_host`` of the
    model. Timed one after the other, as training runs them: the reduce-scatter leaves a host's
    workers in step, so their all-reduces share the host's link at once. Also a tiny all-gather
    after a compute step (the local link's latency). Empty when the workers do not form more
    than one group of ``per_host``, or without a process group."""
    import torch.distributed as dist

    from ..strategies.hsdp import HSDP

    world = collective.world_size
    if not per_host or per_host < 2 or world <= per_host or world % per_host or not dist.is_initialized():
        return {}
    mesh = HSDP(shard_size=per_host).device_mesh(collective)
    shard_group, replica_group = mesh.get_group("shard"), mesh.get_group("replicate")
    all_gather, reduce_scatter, sync = _fsdp_calls(collective.device)
    ones = lambda n: torch.ones(n, device=collective.device)  # noqa: E731
    tiny, shard = TINY // per_host, max(1, params // per_host)
    small, small_whole, mine, whole = ones(tiny), ones(tiny * per_host), ones(shard), ones(shard * per_host)
    gather_tiny = lambda: all_gather(small_whole, small, group=shard_group)  # noqa: E731
    out = {"local_all_gather_tiny": _timed_after_step(gather_tiny, collective, reps, step)}
    calls = (
        lambda: all_gather(whole, mine, group=shard_group),
        lambda: all_gather(whole, mine, group=shard_group),
        lambda: reduce_scatter(mine, whole, group=shard_group),
        lambda: dist.all_reduce(mine, group=replica_group),
    )
    pieces = []
    collective.barrier()
    for _ in range(reps + 1):  # the first is a warm-up
        mine.fill_(1.0)  # (sums of sums would overflow)
        step()
        marks = [time.perf_counter()]
        for call in calls:
            call()
            sync()
            marks.append(time.perf_counter())
        pieces.append([b - a for a, b in zip(marks, marks[1:], strict=False)])
    median = [statistics.median(column) for column in zip(*pieces[1:], strict=True)]
    return {
        **out,
        "local_all_gather": (median[0] + median[1]) / 2,  # the two, priced alike
        "local_reduce_scatter": median[2],
        "replica_allreduce": median[3],
    }


def _connect(info: ConnectInfo, worker_id: int) -> TcpClient:
    from ..ps.transport import TcpTransport

    return TcpTransport().connect(info.address, info.secret, worker_id=worker_id, tls_cert=info.tls_cert)


def _ps_task(info: dict[str, ConnectInfo], sizes: dict[str, int], reps: int):
    def task(_index: int) -> dict[str, float]:
        out = {}
        for name, n in sizes.items():
            with _connect(info[name], 0) as client:
                out[name] = _push_pull_time(client, n, reps)
        return out

    return task


def _ps_shared_task(info: ConnectInfo, n: int, reps: int):
    """Every barrier task's pushes, all at once: what the server's link gives when the workers
    share it. The tasks meet at the stage's barrier before each push; the job takes the slowest
    task's time (the last push through is when the link has carried all of them)."""

    def task(task_info: TaskInfo) -> float:
        from ..spark.task import stage_barrier

        with _connect(info, 1 + task_info.rank) as client:
            versions, push = client.pull().versions, [torch.full((n,), 1e-6)]
            times = []
            for seq in range(reps + 1):  # the first is a warm-up
                stage_barrier()
                started = time.perf_counter()
                client.push(seq, versions, push)
                times.append(time.perf_counter() - started)
            return statistics.median(times[1:])

    return task


def _ps_rounds_task(
    info: ConnectInfo, model: nn.Module, batch: int, sample_shape: tuple[int, ...], n: int, rounds: int
):
    """Every barrier task an asynchronous worker: a compute step, a model-sized push, a pull,
    ``rounds`` times after a warm-up round, all starting at the stage's barrier as training's
    workers start together. Each task's mean round; nothing makes their pushes take turns."""

    def task(task_info: TaskInfo) -> float:
        from ..spark.task import stage_barrier

        step = _compute_step(model, batch, sample_shape)
        with _connect(info, 1000 + task_info.rank) as client:
            centre, push = [torch.empty(n)], [torch.full((n,), 1e-6)]
            versions = client.pull(out=centre).versions
            step()  # the warm-up of the compute step, before the common start
            stage_barrier()
            ends = [time.perf_counter()]
            for seq in range(rounds + 1):  # the first round is a warm-up
                step()
                client.push(seq, versions, push)
                versions = client.pull(out=centre).versions
                ends.append(time.perf_counter())
            return (ends[-1] - ends[1]) / rounds

    return task


def _push_pull_time(client, n: int, reps: int) -> float:  # noqa: ANN001
    """One exchange as an ASGD worker makes it: the pseudo-gradient from the last pulled centre
    and its parameters, the push, the pull, and the centre copied into its parameters."""
    params, ref, centre = torch.zeros(n), torch.zeros(n), [torch.empty(n)]
    state = {"versions": client.pull(out=centre).versions, "seq": client.last_seq}  # pushes continue from it

    def round_trip() -> None:
        state["seq"] += 1
        grads = [ref.sub(params).div_(1e-2)]
        client.push(state["seq"], state["versions"], grads)
        state["versions"] = client.pull(out=centre).versions
        params.copy_(centre[0])
        ref.copy_(centre[0])

    return _median_time(round_trip, reps)


def calibrate(
    model: nn.Module,
    *,
    spark,
    workers: int,
    batch: int = 64,
    sample_shape: tuple[int, ...] = (1, 28, 28),
    reps: int = 10,
    threads: int | None = None,
    shared_memory: bool = True,
    per_host: int | None = None,
) -> Calibration:
    """Measure ``C``, the all-reduce and the parameter-server terms with ``workers`` tasks, and
    with ``per_host`` (workers per host, dividing ``workers`` into two or more hosts) hsdp's
    collectives within and across the hosts.

    ``shared_memory=False`` times gloo's TCP all-reduce even between co-located ranks (for a
    strategy run with ``shared_memory=False``)."""
    from ..ps import ParameterServer
    from ..ps.transport import TcpTransport
    from ..spark.cluster import driver_host
    from ..spark.launcher import run_barrier, run_tasks

    if workers < 1 or reps < 3:
        raise ConfigError(f"calibration needs workers >= 1 and reps >= 3; got {workers} and {reps}")
    params = sum(p.numel() for p in model.parameters())
    results = run_barrier(
        _stage_task(model, batch, sample_shape, reps, threads, shared_memory, per_host),
        workers,
        spark=spark,
        description="sparkdp plan --calibrate: compute and all-reduce",
    )
    from ..rules import RULES

    # the server applies what training's would (ASGD), so the round trip includes its update
    servers = {
        name: ParameterServer(lambda shard: RULES.create("asgd", lr=1e-3), [torch.zeros(n)])
        for name, n in (("tiny", TINY), ("full", params))
    }
    transport = TcpTransport()
    host = driver_host(spark)
    with (
        transport.serve(servers["tiny"], host=host) as tiny,
        transport.serve(servers["full"], host=host) as full,
    ):
        info = {"tiny": tiny.info, "full": full.info}
        (ps,) = run_tasks(
            _ps_task(info, {"tiny": TINY, "full": params}, reps),
            1,
            spark=spark,
            description="sparkdp plan --calibrate: parameter server",
        )
        shared = (
            run_barrier(
                _ps_shared_task(full.info, params, 3),
                workers,
                spark=spark,
                store=False,
                description="sparkdp plan --calibrate: the parameter server's link shared",
            )
            if workers > 1
            else None
        )
        rounds = (
            run_barrier(
                _ps_rounds_task(full.info, model, batch, sample_shape, params, 3),
                workers,
                spark=spark,
                store=False,
                description="sparkdp plan --calibrate: workers cycling through the parameter server",
            )
            if workers > 1
            else None
        )
    median = lambda key: statistics.median(r[key] for r in results) if key in results[0] else None  # noqa: E731
    compute = statistics.median(r["compute"] for r in results)  # every stage task times its compute step
    return Calibration(
        workers,
        params,
        batch,
        compute,
        median("tiny"),
        median("full"),
        ps["tiny"],
        ps["full"],
        _server_apply_s(servers["full"], params, reps),
        max(shared) if shared else None,
        statistics.median(rounds) if rounds else None,
        median("all_gather"),
        median("reduce_scatter"),
        median("partition_broadcast"),
        per_host if "replica_allreduce" in results[0] else None,
        median("local_all_gather_tiny"),
        median("local_all_gather"),
        median("local_reduce_scatter"),
        median("replica_allreduce"),
    )


def _server_apply_s(server, params: int, reps: int) -> float:  # noqa: ANN001
    """Seconds the driver's server takes to apply one model-sized push (its update rule and locking)."""
    push = [torch.full((params,), 1e-6)]
    state = {"seq": server.last_seq(10**6), "versions": server.pull(10**6).versions}  # pushes number from 0

    def apply() -> None:
        state["seq"] += 1
        server.push(worker=10**6, seq=state["seq"], pulled_versions=state["versions"], tensors=push)

    return _median_time(apply, reps)


def measure_steps(
    model_name: str,
    *,
    spark,
    workers: int,
    batch: int = 64,
    rows: int = 12_000,
    average_k: int = 8,
    ps_k: int = 1,
    diloco_h: int = 32,
    diloco_compression: str = "int8",
    shards: int = 1,
    per_host: int | None = None,
) -> dict[str, float]:
    """Real training on Fashion-MNIST: seconds per step of each strategy, from its second epoch
    (allreduce plain and bf16, average, diloco, fsdp, zero1, and hsdp in shard groups of
    ``per_host`` when that divides ``workers``); asgd with its server on the driver and, with
    ``shards`` > 1, with that many server tasks on the executors (the cluster then needs
    ``workers + shards`` task slots).

    What ``sparkdp plan --calibrate --verify`` compares the predictions with: the second epoch
    (the first pays for start-up) divided by each worker's steps in it.
    """
    import math

    from ..data.datasets import dataset_tensors, load_dataset
    from ..models import build_model
    from .api import fit

    train, _ = dataset_tensors(load_dataset("fashion-mnist", limit=rows))
    steps = math.ceil(train.num_samples() / (workers * batch))
    diloco = f"diloco(H={diloco_h}" + (f",{diloco_compression})" if diloco_compression != "none" else ")")
    runs = {
        "allreduce": ("allreduce", {}),
        "allreduce(bf16)": ("allreduce", {"compression": "bf16"}),
        f"average(k={average_k})": ("average", {"period": average_k}),
        diloco: ("diloco", {"period": diloco_h, "compression": diloco_compression}),
        f"asgd(k={ps_k},shards=1)": ("asgd", {"push_every": ps_k}),
        "fsdp": ("fsdp", {}),
        "zero1": ("zero1", {}),
    }
    if per_host and per_host > 1 and workers % per_host == 0:
        # groups of per_host consecutive ranks: a host's workers on a cluster of such hosts, and
        # the same grouping on one machine
        runs[f"hsdp(L={per_host})"] = ("hsdp", {"shard_size": per_host})
    if shards > 1:
        runs[f"asgd(k={ps_k},shards={shards})"] = ("asgd", {"push_every": ps_k, "servers": shards})
    measured = {}
    for label, (strategy, options) in runs.items():
        torch.manual_seed(0)
        result = fit(
            build_model(model_name),
            train,
            strategy=strategy,
            strategy_options=options,
            workers=workers,
            epochs=2,
            batch_size=batch,
            spark=spark,
            show_progress=False,
        )
        measured[label] = result.history[-1]["epoch_time_s"] / steps
    return measured
