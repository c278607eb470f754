"""Predicted step time of each strategy on a cluster: the cost model of docs/algorithms.md §8.

Plain arithmetic, no Spark or torch, so ``sparkdp plan`` answers instantly for any worker
count.  A step is one optimizer step on every worker (``batch`` rows each); its time is the
compute ``C`` plus what communication the strategy adds per step:

* ``allreduce`` — ring all-reduce of the gradient, ``2(M-1)α + 2(M-1)/M·S·β`` (sparkdp's DDP
  overlaps part of it with the backward pass; ``overlap`` is that fraction, 0 by default,
  which is conservative);
* ``average`` — the same ring over the parameters, every ``k`` steps;
* ``diloco`` — the same every ``k`` (H) steps, in ``fragments`` pieces whose reductions may hide
  behind ``overlap_steps`` steps of compute each, plus one small all-reduce of the rows per piece;
* ``fsdp`` — per step an all-gather of the parameters for the forward, another for the backward
  when ``reshard_after_forward`` (the default), and a reduce-scatter of the gradients, each a
  half ring, ``(M-1)α + (M-1)/M·S·β``, times its factor: ``Network.all_gather_factor`` and
  ``Network.reduce_scatter_factor``. Uncalibrated both are 1, the bandwidth-optimal ring (what
  NCCL runs), so fsdp moves 1.5× all-reduce's bytes (1× without resharding); ``sparkdp plan
  --calibrate`` measures them on the process group and backend FSDP uses (gloo on CPUs, whose
  all-gather and reduce-scatter cost more than half an all-reduce; nccl on GPUs). Overlapped
  with compute like ``allreduce``'s (``overlap``); one collective per step and direction is
  priced, not one per shard unit, so the per-unit latencies are left out;
* ``hsdp`` — ``fsdp`` within each host's ``L`` workers on the local link (shared memory or
  loopback, ``Network.local_*``, with the local factors where ``sparkdp plan --calibrate
  --workers-per-host`` measured them, the network's otherwise), then an all-reduce of each
  worker's 1/L of the model across the ``M/L`` hosts on the network link, times
  ``Network.replica_allreduce_factor``;
* ``zero1`` — ZeRO-1 as ``strategies/zero.py`` runs it: the gradients all-reduced as under
  ``allreduce`` (DDP), each worker steps its 1/M of the optimizer state, then each worker's
  partition of the parameters is broadcast over FSDP's process group (an all-gather's bytes,
  priced as one times ``Network.broadcast_factor``, which calibration measures, else
  ``all_gather_factor``): 1.5× all-reduce's bytes in the ring model, overlapped like
  ``allreduce``'s;
* ``compression`` shrinks what a reduction moves (docs/algorithms.md §10): ``bf16``/``fp16``
  halve the ring's bytes; ``int8`` is an all-gather of a quarter of them,
  ``(M-1)α + (M-1)·(S/4 + S/1024)·β``;
* ``asgd`` — every ``k`` steps a worker computes ``k·C``, then pushes ``S`` bytes and pulls
  ``S`` (alone ``k·C + 2α_ps + 2S·β_ps``; over ``K`` shards, pipelined, ``(K+1)/K·S·β_ps``).
  The ``M`` workers queue at the server's link (the update rule adds ``σ`` per byte): mean-value
  analysis (:func:`ps_round_s`) gives the round, bounded by ``(1 + b)·M·S·(β_ps + σ)/K`` with
  the measured bunching ``b`` (``Network.ps_bunching``); docs/algorithms.md §8 derives both.

Memory (:func:`state_bytes`): each worker's model state is the parameters, their gradients
and ``optimizer_states`` optimizer tensors of the parameters' size (AdamW: 2), ``bytes_per_param``
each; ``fsdp`` holds 1/M of all three, ``hsdp`` 1/L, ``zero1`` 1/M of the optimizer's, ``diloco``
two copies more (its anchor and outer momentum). Activations are not in the model: a prediction
``fits`` when that state is within ``memory_per_worker``, which must leave room for them.

Scaling efficiency is ``C / T``: the fraction of a communication-free worker's throughput
each worker keeps.  With ``cpu_slots`` (workers sharing one machine's cores) the compute of
M > slots workers takes M/slots times as long: every worker gets that share of a core (the
communication terms, calibrated under the same sharing, are left as measured).  ``calibrate`` (``sparkdp plan --calibrate``) measures ``C``, ``α``,
``β`` and the parameter-server terms on the user's own cluster.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .errors import ConfigError

STRATEGIES = ("allreduce", "average", "diloco", "asgd", "fsdp", "hsdp", "zero1")
#: strategies that split the model state over the workers (the others keep a whole replica each)
SHARDED = ("fsdp", "hsdp", "zero1")
#: what the model can price: a codec's bytes depend on the parameter count alone (PowerSGD's
#: depend on every tensor's shape, so it is left out)
CODECS = {
    "allreduce": ("none", "bf16", "fp16"),
    "average": ("none", "bf16", "fp16", "int8"),
    "diloco": ("none", "bf16", "fp16", "int8"),
    "asgd": ("none",),
    "fsdp": ("none",),
    "hsdp": ("none",),
    "zero1": ("none",),
}


@dataclass(frozen=True)
class Network:
    """The measured or assumed links.  ``ps_*`` default to the all-reduce link's figures."""

    latency_s: float  # α: one message's fixed cost
    seconds_per_byte: float  # β: 1 / bandwidth in bytes per second
    ps_latency_s: float | None = None  # α_ps: one push or pull's fixed cost
    ps_seconds_per_byte: float | None = None  # β_ps
    server_seconds_per_byte: float = 0.0  # σ: the server's own work per pushed byte (its update rule)
    #: β_link: seconds per byte through a server's link when many workers' transfers share it;
    #: None: β_ps. Several TCP flows through one shaped link get less than one flow alone.
    ps_shared_seconds_per_byte: float | None = None
    #: b: how much of a round the server link's two directions stand idle once workers fall into
    #: step, as a fraction of the link's busy time (0: pushes arrive while pulls leave, the full
    #: duplex limit; 1: every push, then every pull, as if the link were half duplex). Measured
    #: by ``sparkdp plan --calibrate`` from workers cycling through a server.
    ps_bunching: float = 0.0
    #: α_local, β_local: between the workers of one host (shared memory or loopback), what
    #: ``hsdp`` shards over; None: the network's figures
    local_latency_s: float | None = None
    local_seconds_per_byte: float | None = None
    #: what one all-gather (reduce-scatter) on the sharded strategies' process group costs, as a
    #: multiple of the half ring ``(M-1)α + (M-1)/M·S·β`` on the same link; 1: the ring, as NCCL
    #: runs it. ``sparkdp plan --calibrate`` measures both against its all-reduce.
    all_gather_factor: float = 1.0
    reduce_scatter_factor: float = 1.0
    #: zero1's broadcast of every worker's partition of the parameters, as a multiple of the
    #: same half ring; None: priced as an all-gather (``all_gather_factor``). ``sparkdp plan
    #: --calibrate`` measures it with ZeRO-1's own partition, whose sizes need not be equal.
    broadcast_factor: float | None = None
    #: the same within one host's shard group, on the local link; None: the factors above.
    #: ``sparkdp plan --calibrate --workers-per-host`` measures them there.
    local_all_gather_factor: float | None = None
    local_reduce_scatter_factor: float | None = None
    #: hsdp's all-reduce of each worker's shard across the hosts, as a multiple of the ring on this
    #: link: a host's workers run theirs at once through its one link, over torch.distributed's
    #: group rather than the calibrated all-reduce's path. 1: the ring.
    replica_allreduce_factor: float = 1.0

    @classmethod
    def from_link(cls, gbit_per_s: float, latency_ms: float) -> Network:
        if gbit_per_s <= 0 or latency_ms < 0:
            raise ConfigError(
                f"bandwidth must be > 0 Gbit/s and latency >= 0 ms; got {gbit_per_s} and {latency_ms}"
            )
        return cls(latency_ms / 1e3, 8.0 / (gbit_per_s * 1e9))

    @property
    def ps_alpha(self) -> float:
        return self.latency_s if self.ps_latency_s is None else self.ps_latency_s

    @property
    def ps_beta(self) -> float:
        return self.seconds_per_byte if self.ps_seconds_per_byte is None else self.ps_seconds_per_byte

    @property
    def ps_link_beta(self) -> float:
        return self.ps_beta if self.ps_shared_seconds_per_byte is None else self.ps_shared_seconds_per_byte

    def local(self) -> Network:
        """The link between the workers of one host, as a network of its own, with the local
        collectives' factors (the network's where those were not measured)."""
        return Network(
            self.latency_s if self.local_latency_s is None else self.local_latency_s,
            self.seconds_per_byte if self.local_seconds_per_byte is None else self.local_seconds_per_byte,
            all_gather_factor=_either(self.local_all_gather_factor, self.all_gather_factor),
            reduce_scatter_factor=_either(self.local_reduce_scatter_factor, self.reduce_scatter_factor),
        )


def _either(value: float | None, default: float) -> float:
    return default if value is None else value


@dataclass(frozen=True)
class Workload:
    params: int
    step_compute_s: float  # C: forward + backward + optimizer step of one worker's batch
    bytes_per_param: int = 4
    batch: int = 64  # rows per worker per step (for samples/s)
    #: cores all workers share (one machine); None: every worker has its own, as on a cluster
    #: that grows with the workers. More workers than cores stretch every worker's step.
    cpu_slots: int | None = None
    #: optimizer tensors the size of the parameters (AdamW and Adam: 2, SGD with momentum: 1)
    optimizer_states: int = 2
    #: bytes of model state one worker may hold (None: no limit given)
    memory_per_worker: int | None = None

    def cpu_share(self, workers: int) -> float:
        return max(1.0, workers / self.cpu_slots) if self.cpu_slots else 1.0

    @property
    def nbytes(self) -> int:
        return self.params * self.bytes_per_param


@dataclass(frozen=True)
class Prediction:
    strategy: str
    workers: int
    step_s: float
    comm_s: float
    samples_per_s: float
    efficiency: float  # C / T
    bound: str  # what dominates: "compute", "network" or "server"
    options: dict = field(default_factory=dict)
    state_bytes: int = 0  # parameters + gradients + optimizer state one worker holds
    fits: bool | None = None  # state_bytes within Workload.memory_per_worker (None: no limit given)

    @property
    def label(self) -> str:
        # a codec by its name alone: "diloco(H=32,int8)"
        extra = ",".join(str(v) if k == "compression" else f"{k}={v}" for k, v in self.options.items())
        return f"{self.strategy}({extra})" if extra else self.strategy


def ring_allreduce_s(nbytes: float, workers: int, net: Network) -> float:
    """``2(M-1)α + 2(M-1)/M·S·β``; 0 for one worker."""
    if workers <= 1:
        return 0.0
    m = workers
    return 2 * (m - 1) * net.latency_s + 2 * (m - 1) / m * nbytes * net.seconds_per_byte


def half_ring_s(nbytes: float, workers: int, net: Network) -> float:
    """A ring all-gather or reduce-scatter of ``nbytes`` in all: ``(M-1)α + (M-1)/M·S·β``."""
    if workers <= 1:
        return 0.0
    m = workers
    return (m - 1) * net.latency_s + (m - 1) / m * nbytes * net.seconds_per_byte


def all_gather_s(nbytes: float, workers: int, net: Network) -> float:
    """An all-gather of ``nbytes`` in all on the sharded strategies' process group: the half ring
    times ``net.all_gather_factor``."""
    return net.all_gather_factor * half_ring_s(nbytes, workers, net)


def reduce_scatter_s(nbytes: float, workers: int, net: Network) -> float:
    """A reduce-scatter of ``nbytes`` in all: the half ring times ``net.reduce_scatter_factor``."""
    return net.reduce_scatter_factor * half_ring_s(nbytes, workers, net)


def hosts_of(workers: int, per_host: int) -> tuple[int, int]:
    """``(hosts, workers per host)`` of ``workers`` placed ``per_host`` to a host (fewer on one)."""
    if per_host < 1:
        raise ConfigError(f"workers per host must be >= 1; got {per_host}")
    if workers <= per_host:
        return 1, workers
    if workers % per_host:
        raise ConfigError(
            f"hsdp shards within a host and replicates across hosts: {workers} workers do not fill "
            f"hosts of {per_host}; use a multiple of {per_host}"
        )
    return workers // per_host, per_host


def state_bytes(strategy: str, work: Workload, workers: int, per_host: int = 1) -> int:
    """Model state one worker holds under ``strategy`` (the module docstring): parameters,
    gradients and optimizer state, whole or sharded; activations are not counted."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"the cost model knows {', '.join(STRATEGIES)}; got {strategy!r}")
    p, o = work.nbytes, work.optimizer_states * work.nbytes
    if strategy == "fsdp":
        return math.ceil((2 * p + o) / workers)
    if strategy == "hsdp":
        return math.ceil((2 * p + o) / hosts_of(workers, per_host)[1])
    if strategy == "zero1":
        return 2 * p + math.ceil(o / workers)
    return 2 * p + o + (2 * p if strategy == "diloco" else 0)


def reduction_s(nbytes: float, workers: int, net: Network, compression: str = "none") -> float:
    """One reduction of ``nbytes`` of float32 values over ``workers``, sent with ``compression``."""
    if workers <= 1:
        return 0.0
    if compression == "int8":
        m = workers
        return (m - 1) * net.latency_s + (m - 1) * (nbytes / 4 + nbytes / 1024) * net.seconds_per_byte
    return ring_allreduce_s(nbytes / 2 if compression in ("bf16", "fp16") else nbytes, workers, net)


def predict(
    strategy: str,
    work: Workload,
    net: Network,
    workers: int,
    *,
    k: int = 1,
    shards: int = 1,
    overlap: float = 0.0,
    compression: str = "none",
    fragments: int = 1,
    overlap_steps: int = 0,
    reshard_after_forward: bool = True,
    per_host: int = 1,
) -> Prediction:
    """The predicted step of ``strategy`` on ``workers`` workers (see the module docstring);
    ``per_host``: ``hsdp``'s workers per host."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"the cost model knows {', '.join(STRATEGIES)}; got {strategy!r}")
    if workers < 1 or k < 1 or shards < 1 or not 0.0 <= overlap < 1.0 or fragments < 1 or overlap_steps < 0:
        raise ConfigError(
            f"need workers >= 1, k >= 1, shards >= 1, 0 <= overlap < 1, fragments >= 1 and "
            f"overlap_steps >= 0; got {workers}, {k}, {shards}, {overlap}, {fragments}, {overlap_steps}"
        )
    if compression not in CODECS[strategy]:
        raise ConfigError(
            f"the cost model prices {strategy} with compression {', '.join(CODECS[strategy])}; "
            f"got {compression!r}"
        )
    c, s = work.step_compute_s * work.cpu_share(workers), work.nbytes
    options: dict = {"compression": compression} if compression != "none" else {}
    bound = "compute"
    if strategy == "allreduce":
        comm = reduction_s(s, workers, net, compression)
        hidden = min(overlap * comm, c)
        step = c + comm - hidden
        comm -= hidden
    elif strategy in ("fsdp", "hsdp", "zero1"):
        if strategy == "zero1":
            # DDP's all-reduce of the gradients, then the partitions' parameters broadcast
            broadcast = _either(net.broadcast_factor, net.all_gather_factor) * half_ring_s(s, workers, net)
            comm = ring_allreduce_s(s, workers, net) + broadcast
        else:
            hosts, local = hosts_of(workers, per_host) if strategy == "hsdp" else (1, workers)
            shard_net = net.local() if strategy == "hsdp" else net
            gathers = 2 if reshard_after_forward else 1
            # all-gathers and a reduce-scatter within the shard group, then (hsdp) each worker's
            # shard all-reduced with its peers on the other hosts
            comm = (
                gathers * all_gather_s(s, local, shard_net)
                + reduce_scatter_s(s, local, shard_net)
                + net.replica_allreduce_factor * ring_allreduce_s(s / local, hosts, net)
            )
            if not reshard_after_forward:
                options = {"reshard_after_forward": False}
            if strategy == "hsdp":
                options = {"L": per_host, **options}
        hidden = min(overlap * comm, c)
        step = c + comm - hidden
        comm -= hidden
    elif strategy == "average":
        comm = reduction_s(s, workers, net, compression) / k
        step = c + comm
        options = {"k": k, **options}
    elif strategy == "diloco":
        # each piece: its reduction and the rows' all-reduce, less what overlap_steps of compute hide
        piece = reduction_s(s / fragments, workers, net, compression) + (
            ring_allreduce_s(8, workers, net) if workers > 1 else 0.0
        )
        comm = fragments * max(0.0, piece - overlap_steps * c) / k
        step = c + comm
        options = {
            "H": k,
            **options,
            **({"fragments": fragments} if fragments > 1 else {}),
            **({"overlap_steps": overlap_steps} if overlap_steps else {}),
        }
    else:
        # a push and a pull cross each shard's link a K-th part (the shared queues) and the
        # worker's own link whole, pipelined: K pushes of S/K in turn, each shard's pull
        # overlapping the next push, so (K+1)/K·S·β there in all, of which 2·S/K·β is queued
        own = 2 * net.ps_alpha + s * net.ps_beta * (1 - 1 / shards)
        inbound = s * (net.ps_link_beta + net.server_seconds_per_byte) / shards
        outbound = s * net.ps_link_beta / shards
        # the link's own limit: M transfers each way per round, stretched by the workers' bunching
        link = (1 + net.ps_bunching) * workers * max(inbound, outbound)
        step = max(ps_round_s(k * c + own, inbound, outbound, workers), link) / k
        comm = step - c
        if link > k * c + own + inbound + outbound:
            bound = "server"  # its link, busy all the time, paces the workers
        options = {"k": k, "shards": shards}
    if bound == "compute" and comm > c:
        bound = "network"
    held = state_bytes(strategy, work, workers, per_host)
    return Prediction(
        strategy,
        workers,
        step,
        comm,
        workers * work.batch / step,
        work.step_compute_s / step,
        bound,
        options,
        held,
        None if work.memory_per_worker is None else held <= work.memory_per_worker,
    )


def ps_round_s(think_s: float, in_s: float, out_s: float, workers: int) -> float:
    """One worker's round through a parameter server: ``think_s`` on its own (compute and
    latencies), then a push through the server link's inbound queue (``in_s`` of transfer)
    and a pull through its outbound queue (``out_s``), with ``workers`` workers cycling.

    Exact mean-value analysis (Reiser and Lavenberg, JACM 1980) of that closed network,
    with one change: a transfer found in progress has half its time left on average (the
    transfers are of fixed size, not exponential), so a worker arriving at a queue waits
    ``D·(Q − U/2)``, with ``Q`` its mean length and ``U`` its utilisation.  Between one
    worker (``think + in + out``) and many (``workers · max(in, out)``, the link saturated),
    it prices the collisions of pushes that a plain maximum of the two bounds misses."""
    demands = (in_s, out_s)
    queued = [0.0, 0.0]
    busy = [0.0, 0.0]
    round_s = think_s + in_s + out_s
    for n in range(1, workers + 1):
        waits = [d * (1.0 + q - u / 2) for d, q, u in zip(demands, queued, busy)]
        # (the half-transfer correction is approximate: never past the link's own limit)
        round_s = max(think_s + sum(waits), n * max(demands))
        rate = n / round_s  # rounds per second of all n workers
        queued = [rate * w for w in waits]
        busy = [rate * d for d in demands]
    return round_s


def worker_counts(maximum: int) -> list[int]:
    """1, 2, 4, ... up to ``maximum`` (and ``maximum`` itself)."""
    if maximum < 1:
        raise ConfigError(f"workers must be >= 1; got {maximum}")
    counts = [2**i for i in range(int(math.log2(maximum)) + 1)]
    return counts if counts[-1] == maximum else [*counts, maximum]


def table(
    work: Workload,
    net: Network,
    counts: Sequence[int],
    *,
    average_k: int = 8,
    ps_k: int = 1,
    shards: int = 1,
    overlap: float = 0.0,
    diloco_h: int = 32,
    diloco_compression: str = "int8",
    per_host: int | None = None,
) -> list[Prediction]:
    """Every strategy at every worker count: allreduce (plain and bf16), average(k),
    diloco(H, compression) and asgd(k) with its server on the driver (shards=1) and, when
    ``shards`` > 1, with that many server tasks on the executors (``servers=shards``); then
    the sharded ones: fsdp, zero1 and, given ``per_host`` workers per host, hsdp (at the
    counts that fill whole hosts)."""
    rows = []
    for m in counts:
        rows.append(predict("allreduce", work, net, m, overlap=overlap))
        rows.append(predict("allreduce", work, net, m, overlap=overlap, compression="bf16"))
        rows.append(predict("average", work, net, m, k=average_k))
        rows.append(predict("diloco", work, net, m, k=diloco_h, compression=diloco_compression))
        rows.append(predict("asgd", work, net, m, k=ps_k))
        if shards > 1:
            rows.append(predict("asgd", work, net, m, k=ps_k, shards=shards))
        rows.append(predict("fsdp", work, net, m, overlap=overlap))
        rows.append(predict("zero1", work, net, m, overlap=overlap))
        if per_host and per_host > 1 and (m <= per_host or m % per_host == 0):
            rows.append(predict("hsdp", work, net, m, overlap=overlap, per_host=per_host))
    return rows


def recommend(rows: Sequence[Prediction], workers: int) -> str:
    """One sentence: the fastest strategy at ``workers`` among those whose model state fits the
    memory per worker, and whether synchronous training still scales."""
    at = [r for r in rows if r.workers == workers]
    if not at:
        raise ConfigError(f"no prediction for {workers} workers")
    fitting = [r for r in at if r.fits is not False]
    if not fitting:
        least = min(at, key=lambda r: r.state_bytes)
        return (
            f"none: no strategy's model state fits the memory per worker at {workers} workers; the "
            f"least is {least.label}'s {size_text(least.state_bytes)}. Use more workers (fsdp's share "
            "shrinks with them), an optimizer with less state, or more memory."
        )
    sync = next(r for r in at if r.strategy == "allreduce" and not r.options)
    best = max(fitting, key=lambda r: r.samples_per_s)
    if sync.fits is False:
        return (
            f"{best.label}: allreduce's model state ({size_text(sync.state_bytes)} per worker) does not "
            f"fit the memory per worker; {best.label} holds {size_text(best.state_bytes)} and keeps "
            f"{best.efficiency:.0%} of each worker's compute speed at {workers} workers."
        )
    if sync.efficiency >= 0.8 or best is sync:
        return (
            f"allreduce: {sync.efficiency:.0%} scaling efficiency at {workers} workers; it trains exactly like "
            "one process on the combined batch, so prefer it."
        )
    why = (
        "sends 16-bit gradients, which rarely changes accuracy"
        if best.strategy == "allreduce"
        else f"{best.strategy} communicates less often or without a barrier, which can need more epochs to reach "
        "the same accuracy"
    )
    return (
        f"{best.label}: {best.samples_per_s / sync.samples_per_s:.2f}x allreduce's throughput at {workers} "
        f"workers, where allreduce keeps only {sync.efficiency:.0%} of each worker's compute speed; {why}."
    )


def size_text(nbytes: float) -> str:
    """Bytes in binary units: ``"1.5 GiB"``, ``"300 MiB"``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3}
_UNITS.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tb": 1000**4, "tib": 1 << 40})


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"1.5 GB"``, ``"512MiB"``, ``"1000000"`` -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(
            f"a memory size is a positive number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, "
            f"GiB, TiB), e.g. 2GiB or 1.5GB; got {text!r}"
        )
    return int(float(match.group(1)) * _UNITS[unit])
