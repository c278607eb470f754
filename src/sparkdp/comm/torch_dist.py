"""torch.distributed behind the Collective interface: gloo on CPU, NCCL on GPU."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import struct
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import ConfigError, RendezvousTimeout
from .base import Collective, Pending
from .torchrun_env import Placement, torchrun_env

log = logging.getLogger(__name__)

# gloo's worker threads drop a finished collective's tensors after ``wait()`` has
# returned, and in this torch (2.13) dropping a tensor that Python created takes
# the GIL. The process group's destructor joins those threads while holding the
# GIL, so a thread still queued for the GIL deadlocks the process: seen once as a
# rank-0 Spark task hung in ~ProcessGroupGloo (via DDP's Reducer) after training.
# Sleeping releases the GIL long enough for the threads to finish and go idle.
_QUIESCE_S = 0.05

_OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


#: The GLOO_SOCKET_IFNAME value sparkdp itself chose last in this process (a user's own is kept).
_CHOSEN_IFNAME: str | None = None


def source_address(remote: str) -> str | None:
    """The address of this host that packets to ``remote`` leave from (the kernel's route
    lookup: a UDP socket "connected" to it sends nothing), or None when there is no route."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(remote, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(sockaddr)
            return sock.getsockname()[0]
    except OSError:
        return None


def interface_addresses() -> dict[str, list[str]]:
    """Each network interface's addresses (IPv4 through SIOCGIFADDR, IPv6 from /proc/net/if_inet6);
    Linux only, {} elsewhere."""
    if not sys.platform.startswith("linux"):
        return {}
    import fcntl

    found: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )  # SIOCGIFADDR
                found.setdefault(name, []).append(socket.inet_ntoa(packed[20:24]))
            except OSError:  # no IPv4 address on it
                continue
    try:
        for line in open("/proc/net/if_inet6").read().splitlines():
            parts = line.split()
            if len(parts) >= 6:
                found.setdefault(parts[5], []).append(str(ipaddress.IPv6Address(bytes.fromhex(parts[0]))))
    except OSError:
        pass
    return found


def interface_towards(remote: str) -> tuple[str, str] | None:
    """``(interface, local address)`` this host reaches ``remote`` through, or None if unknown."""
    local = source_address(remote)
    if local is None:
        return None
    local_ip = ipaddress.ip_address(local.split("%")[0])
    for name, addresses in interface_addresses().items():
        if any(ipaddress.ip_address(a) == local_ip for a in addresses):
            return name, local
    return None


def _choose_gloo_interface(master_addr: str) -> None:
    """Point gloo at the interface that reaches ``master_addr``.

    Left alone, gloo binds to the address this host's name resolves to: on many machines that is
    127.0.1.1 (a distribution's default /etc/hosts), and then every other host's connection is
    refused although the rendezvous on the real address worked. A GLOO_SOCKET_IFNAME the user set
    is kept."""
    global _CHOSEN_IFNAME
    current = os.environ.get("GLOO_SOCKET_IFNAME")
    if current is not None and current != _CHOSEN_IFNAME:
        return  # the user's own choice
    if master_addr.startswith("127.") or master_addr in ("localhost", "::1"):
        chosen: str | None = "lo"
    else:
        found = interface_towards(master_addr)
        chosen = found[0] if found else None
        if found:
            log.info(
                "gloo uses interface %s (%s), the route to the rendezvous at %s",
                found[0],
                found[1],
                master_addr,
            )
    if chosen is None:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)  # gloo falls back to the hostname's address
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = chosen
    _CHOSEN_IFNAME = chosen


def choose_gloo_interface(rendezvous_host: str) -> None:
    """Point gloo at the interface that reaches ``rendezvous_host`` (see :func:`_choose_gloo_interface`;
    a group formed outside :class:`TorchCollective`, ``comm.quorum_group``'s, calls this first)."""
    _choose_gloo_interface(rendezvous_host)


def gloo_interface_note() -> str:
    """What gloo binds to in this process, and where that came from, for error messages."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    if name is None:
        host = socket.gethostname()
        try:
            resolved = socket.gethostbyname(host)
        except OSError:
            resolved = "unresolvable"
        return (
            f"gloo used the address this host's name {host!r} resolves to ({resolved}); set "
            "GLOO_SOCKET_IFNAME in the executors' environment (spark.executorEnv.GLOO_SOCKET_IFNAME) to the "
            "interface the other hosts reach this one on"
        )
    addresses = ", ".join(interface_addresses().get(name, [])) or "no address"
    origin = (
        "chosen by sparkdp as the route to the rendezvous address"
        if name == _CHOSEN_IFNAME
        else "set in the environment"
    )
    return (
        f"gloo used interface GLOO_SOCKET_IFNAME={name} ({addresses}; {origin}); if the other hosts cannot "
        "reach that address, set GLOO_SOCKET_IFNAME in the executors' environment "
        "(spark.executorEnv.GLOO_SOCKET_IFNAME) to the interface they reach this host on"
    )


#: How long a rank keeps trying to open a TCP connection to the rendezvous store before it gives
#: up with an error naming the address (rank 0 may still be starting its store; when the launcher
#: shares the port, the store is already listening and a refusal is final).
STORE_CONNECT_GRACE_S = 10.0


def check_store_reachable(
    master_addr: str, master_port: int, rank: int, world_size: int, grace_s: float = STORE_CONNECT_GRACE_S
) -> None:
    """Raise :class:`RendezvousTimeout` naming the address within ``grace_s`` when no TCP connection
    to the store opens, instead of letting torch's client retry until the process-group timeout."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            with socket.create_connection((master_addr, master_port), timeout=max(0.5, min(5.0, grace_s))):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    local = source_address(master_addr)
    raise RendezvousTimeout(
        f"rank {rank}/{world_size} cannot open a TCP connection to the rendezvous store at "
        f"{master_addr}:{master_port} (rank 0's executor) from {local or 'this host (no route)'}: "
        f"{type(last).__name__}: {last} (tried for {grace_s:g} s). The executors must reach each other: "
        "a firewall between them must pass TCP to the ports the OS chooses (net.ipv4.ip_local_port_range), "
        "and rank 0's executor address (Spark's, see SPARK_LOCAL_IP) must be one the other hosts reach."
    )


def set_torch_distributed_env(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    placement: Placement | None = None,
    *,
    run_id: str = "none",
    restart_count: int = 0,
    max_restarts: int = 0,
) -> None:
    """The one place that sets the environment torch.distributed reads (design rule 6, docs/architecture.md):
    all of torchrun's variables (:mod:`sparkdp.comm.torchrun_env`). ``placement``: the rank's place among
    the job's ranks; None: every rank on this host."""
    placement = placement or Placement.one_host(rank, world_size)
    if (placement.rank, placement.world_size) != (rank, world_size):
        raise ValueError(f"placement {placement} is not rank {rank} of {world_size}")
    os.environ.update(
        torchrun_env(
            placement,
            master_addr,
            master_port,
            run_id=run_id,
            restart_count=restart_count,
            max_restarts=max_restarts,
        )
    )
    _choose_gloo_interface(master_addr)


def set_restart_env(restart: int, max_restarts: int, checkpoint_dir: str | None) -> None:
    """What a restarted torchrun worker reads: ``TORCHELASTIC_RESTART_COUNT`` (0 in the first
    attempt, n in the n-th restart of the job), ``TORCHELASTIC_MAX_RESTARTS`` (the job's
    ``max_restarts``) and, when the job has one, its checkpoint directory as
    ``SPARKDP_CHECKPOINT_DIR`` (where the script saves and finds what it resumes from). Set by
    ``sparkdp.run``'s worker body: a barrier task's environment holds the same two numbers already
    (``sparkdp.train.jobs.in_task``), an asynchronous task's has no torchrun environment."""
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(restart)
    os.environ["TORCHELASTIC_MAX_RESTARTS"] = str(max_restarts)
    if checkpoint_dir is not None:
        os.environ["SPARKDP_CHECKPOINT_DIR"] = checkpoint_dir
    else:
        os.environ.pop("SPARKDP_CHECKPOINT_DIR", None)


class TorchCollective(Collective):
    """A process group created by :meth:`setup` and destroyed by :meth:`teardown`.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks NCCL when ``device`` is CUDA.
        device: where collective buffers live (the task's GPU, or CPU).
    """

    def __init__(self, backend: str | None = None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.backend = backend or ("nccl" if self.device.type == "cuda" else "gloo")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(
                f"Unknown torch.distributed backend {backend!r}; use 'gloo' (CPU) or 'nccl' (GPU)."
            )
        self._owns_group = False
        self._store: dist.Store | None = None

    def setup(
        self,
        *,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        timeout_s: float = 300.0,
        store: dist.Store | None = None,
        store_listening: bool = False,
        placement: Placement | None = None,
        run_id: str = "none",
        restart_count: int = 0,
        max_restarts: int = 0,
    ) -> TorchCollective:
        """Join the process group; ``store`` is rank 0's already-listening TCPStore, if any.

        ``store_listening``: rank 0's store listens already (the launcher shares its port only
        then), so a rank that cannot connect to it within :data:`STORE_CONNECT_GRACE_S` fails at
        once, naming the address, instead of after ``timeout_s``. ``placement``, ``run_id``,
        ``restart_count``, ``max_restarts``: the torchrun environment a script sees
        (:func:`set_torch_distributed_env`)."""
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group is already initialised in this process")
        set_torch_distributed_env(
            master_addr,
            master_port,
            rank,
            world_size,
            placement,
            run_id=run_id,
            restart_count=restart_count,
            max_restarts=max_restarts,
        )
        started = time.monotonic()
        if store is None and rank != 0 and store_listening:
            check_store_reachable(
                master_addr, master_port, rank, world_size, min(timeout_s, STORE_CONNECT_GRACE_S)
            )
        try:
            if store is None:
                store = dist.TCPStore(
                    master_addr,
                    master_port,
                    world_size,
                    is_master=(rank == 0),
                    timeout=timedelta(seconds=timeout_s),
                )
        except (RuntimeError, TimeoutError) as exc:  # torch raises DistStoreError (RuntimeError) on timeout
            raise RendezvousTimeout(
                f"rank {rank}/{world_size} could not reach the rendezvous store at {master_addr}:{master_port} "
                f"(rank 0's executor) after {time.monotonic() - started:.0f} s (timeout {timeout_s:.0f} s): {exc}. "
                "Check that the executors can reach each other on that address and that a firewall passes TCP "
                "to that port."
            ) from exc
        try:
            # under NCCL the loop's small CPU tensors (loss sums, batch counts) go through gloo
            backend = "cpu:gloo,cuda:nccl" if self.backend == "nccl" else self.backend
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
            )
        except (RuntimeError, TimeoutError) as exc:
            raise RendezvousTimeout(
                f"rank {rank}/{world_size} reached the rendezvous store at {master_addr}:{master_port}, but the "
                f"{self.backend} connections between the ranks failed after {time.monotonic() - started:.0f} s "
                f"(timeout {timeout_s:.0f} s): {exc}. {gloo_interface_note()}."
            ) from exc
        self._owns_group = True
        self._store = store
        return self

    def stalled_ranks(self, grace_s: float = 3.0) -> list[int] | None:
        """Every rank that times out leaves a mark in rank 0's store; after ``grace_s`` (the others
        time out at about the same moment) the ranks without one are the stalled ones. A stopped
        rank 0 stops its store too: then nobody answers within the store timeout."""
        if self._store is None:
            return None
        try:
            self._store.set_timeout(timedelta(seconds=grace_s))
            self._store.set(f"sparkdp/timed-out/{self.rank}", "1")
            time.sleep(grace_s)
            missing = [r for r in range(self.world_size) if not self._store.check([f"sparkdp/timed-out/{r}"])]
        except (RuntimeError, ValueError):  # DistStoreError is a RuntimeError: the store is gone
            return [0] if self.rank != 0 else None
        return missing or None

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op == "mean":
            dist.all_reduce(tensor, dist.ReduceOp.SUM)
            tensor.div_(self.world_size)
            return tensor
        if op not in _OPS:
            raise ConfigError(f"unknown reduction {op!r}; use one of sum, mean, min, max")
        dist.all_reduce(tensor, _OPS[op])
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        dist.broadcast(tensor, src)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return self.start_all_gather(tensor).wait()

    def start_all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> Pending:
        if op not in ("sum", "mean"):
            return super().start_all_reduce(tensor, op)
        work = dist.all_reduce(tensor, dist.ReduceOp.SUM, async_op=True)
        world = self.world_size

        def finish() -> torch.Tensor:
            work.wait()
            return tensor.div_(world) if op == "mean" else tensor

        return Pending(finish)

    def start_all_gather(self, tensor: torch.Tensor) -> Pending:
        out = [torch.empty_like(tensor) for _ in range(self.world_size)]
        work = dist.all_gather(out, tensor.contiguous(), async_op=True)
        return Pending(lambda: (work.wait(), out)[1])

    def barrier(self) -> None:
        dist.barrier()

    def teardown(self) -> None:
        if self._owns_group and dist.is_initialized():
            time.sleep(_QUIESCE_S)  # see _QUIESCE_S
            dist.destroy_process_group()
        self._owns_group = False
