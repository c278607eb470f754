"""Processes a worker starts join its job: two-level Hogwild! for scripts that spawn.

A Hogwild! script (``model.share_memory()``, then ``torch.multiprocessing.Process``es that
each build an optimizer and a loader and call ``sparkdp.distribute``) runs its processes
inside one Spark worker. While a launched script runs in an asynchronous job, every process
it starts (``multiprocessing`` or ``torch.multiprocessing``; spawn, fork or forkserver) is
handed a *child spec*: a JSON file, readable only by this user, in a private directory,
named by the ``SPARKDP_CHILD_SPEC`` environment variable the child inherits. The child's
``distribute`` reads it and connects to the job's parameter server as a worker of its own,
so the processes of one Spark worker share their model in memory exactly as the script
intends (Hogwild! inside the machine) while each exchanges with the server (Hogwild!/ASGD
across machines). Child ``k`` of Spark worker ``rank`` (of ``W``) is server worker
``W * (k + 1) + rank``: distinct from every Spark worker and every other child, and the
same when the task is restarted, so its sequence numbers continue and no push counts twice.
"""

from __future__ import annotations

import json
import multiprocessing.process
import multiprocessing.util
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..monitor.probe import WorkerProbe
    from ..strategies.base import Strategy
    from .role import WorkerRole


class ParentContext(Protocol):
    """What this module reads of a worker's context (``train.context.WorkerContext``, which
    imports this module to build a child's context: a protocol keeps the two out of a cycle)."""

    rank: int
    world_size: int
    seed: int
    strategy: Strategy
    probe: WorkerProbe | None

    @property
    def role(self) -> WorkerRole: ...

    def finish(self) -> None: ...


ENV = "SPARKDP_CHILD_SPEC"
#: the most bytes a child spec may have (a certificate, a secret, a few settings)
_MAX_SPEC_BYTES = 64 * 1024


#: the most processes one worker may start that join the job: the parameter server accepts the
#: ids of these and no others (:func:`job_worker_ids`)
MAX_CHILDREN = 64


def child_worker_id(rank: int, world_size: int, child: int) -> int:
    """The parameter-server worker id of process ``child`` started by Spark worker ``rank``."""
    if child >= MAX_CHILDREN:
        raise ConfigError(
            f"process {child} of worker {rank} cannot join the job: a worker may start at most "
            f"{MAX_CHILDREN} processes that join it; start fewer (e.g. one per core)."
        )
    return world_size * (child + 1) + rank


def job_worker_ids(world_size: int) -> int:
    """How many parameter-server worker ids a job of ``world_size`` workers uses: ``0..n-1`` are
    the workers and the processes they may start."""
    return world_size * (MAX_CHILDREN + 1)


@dataclass
class Children:
    """The processes a worker's script started, and which of them joined the job."""

    #: whether they could join: an asynchronous job, whose server takes them as workers of their own
    joinable: bool = False
    started: int = 0
    joined: list[int] = field(default_factory=list)


@contextmanager
def children_join(ctx: ParentContext) -> Iterator[Children]:
    """While the block runs, every process this one starts is counted and, in an asynchronous
    job, gets a child spec of ``ctx``'s job; which joined (called ``distribute``) is known when
    the block ends. In a synchronous job they cannot join the workers' process group."""
    # (transport, ConnectInfo) of an asynchronous job
    server = getattr(ctx.strategy, "server_link", None)  # a synchronous strategy has none
    info = server[1] if server is not None and ctx.role.children_join else None
    joinable = info is not None
    # mode 0700; a synchronous job writes no spec, so it needs none
    directory = Path(tempfile.mkdtemp(prefix="sparkdp-children-")) if joinable else None
    server_spec = (
        None
        if info is None
        else {
            "address": info.address,
            "secret": info.secret.hex(),
            "tls_cert": info.tls_cert,
            # sparkdp.run's server takes its centre from the first worker's model, a child's included
            "offer_centre": bool(getattr(ctx.strategy, "offers_centre", False)),
        }
    )
    base = (
        {
            "rank": ctx.rank,
            "world_size": ctx.world_size,
            "seed": ctx.seed,
            "strategy": ctx.strategy.options(),
            "server": server_spec,
            "monitor": _monitor(ctx.probe),
            "joined_dir": str(directory),
        }
        if joinable
        else {}
    )
    children = Children(joinable)
    original = multiprocessing.process.BaseProcess.start

    def start(process: multiprocessing.process.BaseProcess) -> None:
        child = children.started
        children.started += 1
        if directory is None:
            original(process)
            return
        path = directory / f"child-{child}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({**base, "child": child}, fh)
        before = os.environ.get(ENV)
        os.environ[ENV] = str(path)  # a spawned child reads the environment as it is now
        try:
            original(process)
        finally:
            if before is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = before

    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign,assignment]
    try:
        yield children
    finally:
        multiprocessing.process.BaseProcess.start = original  # type: ignore[method-assign]
        if directory is not None:
            children.joined.extend(sorted(int(p.name.split("-")[1]) for p in directory.glob("joined-*")))
            shutil.rmtree(directory, ignore_errors=True)


def _monitor(probe: WorkerProbe | None) -> dict[str, Any] | None:
    link = getattr(probe, "link", None)
    if link is None:
        return None
    return {
        "address": link.info.address,
        "secret": link.info.secret.hex(),
        "tls_cert": link.info.tls_cert,
        "interval_s": link.interval_s,
    }


def read_child_spec(path: str) -> dict[str, Any]:
    """The spec a parent process wrote for this one; checked, never executed or unpickled."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(
            f"{ENV}={path!r} cannot be read as a sparkdp child spec ({exc}); a process that is "
            "not started by a sparkdp worker should not have it set."
        ) from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size > _MAX_SPEC_BYTES:
        raise ConfigError(
            f"{ENV}={path!r} is not a child spec this user's sparkdp worker wrote "
            "(it must be private to the user and small); unset it."
        )
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{ENV}={path!r} cannot be read as a sparkdp child spec ({exc}); a process that is "
            "not started by a sparkdp worker should not have it set."
        ) from None
    need = {
        "rank": int,
        "world_size": int,
        "child": int,
        "seed": int,
        "strategy": dict,
        "server": dict,
        "joined_dir": str,
    }  # (a synchronous job writes no spec: its children cannot join)
    if not isinstance(spec, dict) or any(not isinstance(spec.get(k), t) for k, t in need.items()):
        raise ConfigError(f"{ENV}={path!r} is not a complete sparkdp child spec.")
    return spec


def child_parts(spec: dict[str, Any]) -> dict[str, Any]:
    """The worker context (``train.context.WorkerContext``'s fields) of a process a Spark worker
    started: its own connection to the job's server, its own monitoring id."""
    from ..comm.single import IndependentCollective
    from ..monitor.probe import MonitorLink, open_probe
    from ..ps.transport import TcpOptions, TcpTransport
    from ..ps.transport.base import ConnectInfo
    from ..strategies.async_ps import AsyncParameterServer

    options = dict(spec["strategy"])
    strategy = AsyncParameterServer(**options)
    server = spec["server"]
    transport = TcpTransport(TcpOptions(mac_payload=strategy.mac_payload, tls=strategy.tls))
    strategy.connect_to(
        transport,
        ConnectInfo(server["address"], bytes.fromhex(server["secret"]), server.get("tls_cert")),
        offer_centre=server.get("offer_centre") is True,
    )
    rank, world, child = spec["rank"], spec["world_size"], spec["child"]
    strategy.worker_id = child_worker_id(rank, world, child)
    monitor = spec.get("monitor")
    link = (
        None
        if not monitor
        else MonitorLink(
            ConnectInfo(monitor["address"], bytes.fromhex(monitor["secret"]), monitor.get("tls_cert")),
            float(monitor["interval_s"]),
        )
    )
    probe = open_probe(link, strategy.worker_id)
    Path(spec["joined_dir"], f"joined-{child}").touch()
    # the children of one Spark worker read its shard, each in its own order
    return {
        "rank": rank,
        "world_size": world,
        "collective": IndependentCollective(rank, world),
        "strategy": strategy,
        "seed": spec["seed"] + 7919 * (child + 1),
        "probe": probe,
        "child": child,
    }


def finish_at_exit(ctx: ParentContext) -> None:
    """The child's loop ends without telling sparkdp: its last pushes and records go when the
    process exits (multiprocessing runs these finalizers for spawned and forked processes alike)."""
    if ctx.probe is not None:  # (child_parts always opens one)
        multiprocessing.util.Finalize(None, ctx.probe.close, exitpriority=20)
    multiprocessing.util.Finalize(None, ctx.finish, exitpriority=21)


__all__ = [
    "ENV",
    "MAX_CHILDREN",
    "Children",
    "ParentContext",
    "child_parts",
    "child_worker_id",
    "children_join",
    "job_worker_ids",
    "finish_at_exit",
    "read_child_spec",
]
