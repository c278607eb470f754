"""One worker's connections to K parameter servers, each holding one key range of the model.

A :class:`~sparkdp.ps.sharding.ShardPlan` with K shards splits the parameters into K byte-balanced
key ranges (whole small tensors, flat chunks of big ones); server ``s`` holds range ``s`` as a
list of 1-D pieces and is an ordinary :class:`~sparkdp.ps.server.ParameterServer` over them.
:class:`ShardedClient` looks like one client to the worker: a push sends each server its pieces,
a pull receives each server's pieces straight into the parameter-shaped buffers, and both go to
all servers at once, one thread per connection (sockets release the GIL), so K servers on K
links move the model in about a K-th of the time one link takes (Li et al., OSDI 2014; Downpour).

Versions are the servers' version lists end to end; a push hands each server its own part.
Each server keeps its own record of every worker's last applied push: a worker reconnecting
after a failure continues after the smallest of them, and a server that already applied a
sequence number acknowledges it again without applying it, so no push lands twice on any key.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from sparkdp.ps.server import Pulled, PushAck
from sparkdp.ps.sharding import ShardPlan
from sparkdp.ps.transport.base import Client

_T = TypeVar("_T")


def _results(futures: Sequence[Future[_T]]) -> tuple[list[_T], BaseException | None]:
    """The futures' results, in order, and the first failure, once every one has ended."""
    results, error = [], None
    for f in futures:
        try:
            results.append(f.result())
        except BaseException as exc:
            error = error or exc
    return results, error


@dataclass(frozen=True)
class ShardedInfo:
    """Where a worker finds the K servers: their addresses and TLS certificates by key range.

    Field names match :class:`~sparkdp.ps.transport.base.ConnectInfo`'s, so a strategy connects
    through either the same way; the secret is one per job, shared by every server."""

    address: tuple[str, ...]
    secret: bytes
    tls_cert: tuple[str | None, ...]

    def __repr__(self) -> str:
        return f"ShardedInfo(address={self.address!r}, secret=<{len(self.secret)} bytes>)"


class ShardedTransport:
    """Connects a worker to every server of a :class:`ShardedInfo` through ``inner`` (TCP)."""

    def __init__(self, inner: Any, plan: ShardPlan) -> None:
        self.inner, self.plan = inner, plan

    def connect(
        self,
        address: Sequence[str],
        secret: bytes,
        worker_id: int,
        *,
        timeout: float = 30.0,
        tls_cert: Sequence[str | None] | None = None,
    ) -> ShardedClient:
        if len(address) != self.plan.num_shards:
            raise ValueError(
                f"{len(address)} server addresses for a model split into {self.plan.num_shards} "
                "key ranges; give one address per range."
            )
        certs = list(tls_cert) if tls_cert is not None else [None] * len(address)
        with ThreadPoolExecutor(len(address), thread_name_prefix="sparkdp-ps-connect") as pool:
            clients, error = _results(
                [
                    pool.submit(self.inner.connect, a, secret, worker_id, timeout=timeout, tls_cert=c)
                    for a, c in zip(address, certs, strict=True)
                ]
            )
        if error is not None:  # close the ones that connected; raise the first failure
            for c in clients:
                c.close()
            raise error
        return ShardedClient(clients, self.plan)


class ShardedClient(Client):
    """The union of K servers' clients, server ``s`` holding ``plan``'s shard ``s``."""

    def __init__(self, clients: Sequence[Client], plan: ShardPlan) -> None:
        self.clients, self.plan = list(clients), plan
        self.worker_id = self.clients[0].worker_id
        self.num_shards = sum(c.num_shards for c in self.clients)
        self.last_seq = min(c.last_seq for c in self.clients)
        self._widths = [c.num_shards for c in self.clients]
        self._pool = ThreadPoolExecutor(len(self.clients), thread_name_prefix="sparkdp-ps-shard")

    def _each(self, call: Callable[[int, Client], _T]) -> list[_T]:
        """``call(s, client_s)`` on every server at once; the first failure is raised after all end."""
        results, error = _results([self._pool.submit(call, s, c) for s, c in enumerate(self.clients)])
        if error is not None:
            raise error
        return results

    def pull(self, *, out: Sequence[Tensor] | None = None, observe: bool = False) -> Pulled:
        if out is None:
            out = [torch.empty(spec.shape, dtype=spec.dtype) for spec in self.plan.params]
        else:
            self.plan.check(out, "pull(out=...)")
        dense = [t if t.is_contiguous() else t.contiguous() for t in out]  # pieces are views of these
        pulled = self._each(lambda s, c: c.pull(out=self.plan.views(dense, s), observe=observe))
        for dst, src in zip(out, dense, strict=True):
            if dst is not src:
                dst.copy_(src)
        return Pulled([v for p in pulled for v in p.versions], list(out))

    def push(
        self,
        seq: int,
        pulled_versions: Sequence[int] | None,
        tensors: Sequence[Tensor],
        *,
        num_samples: int = 1,
        local_steps: int = 1,
    ) -> PushAck:
        self.plan.check(tensors, f"push from worker {self.worker_id}")
        dense = [t.contiguous() for t in tensors]
        parts = self._split(pulled_versions)
        acks = self._each(
            lambda s, c: c.push(
                seq, parts[s], self.plan.views(dense, s), num_samples=num_samples, local_steps=local_steps
            )
        )
        return PushAck([v for a in acks for v in a.versions], all(a.applied for a in acks))

    def exchange(
        self,
        seq: int,
        pulled_versions: Sequence[int] | None,
        tensors: Sequence[Tensor],
        *,
        num_samples: int = 1,
        local_steps: int = 1,
    ) -> tuple[PushAck, Pulled]:
        """A push, then a pull of the centre it went into, pipelined over the servers: the pushes
        take turns on this worker's uplink (each at its full rate) and server ``s``'s pull starts
        as soon as its push is acknowledged, while the next server's push is still going up. Each
        server still sees this worker's push before its pull, as with :meth:`push` then
        :meth:`pull`, but the worker's own link carries its two directions at once: ``(K + 1) / K``
        of the model's transfer time per round instead of 2."""
        self.plan.check(tensors, f"push from worker {self.worker_id}")
        dense = [t.contiguous() for t in tensors]
        parts = self._split(pulled_versions)
        out = [torch.empty(spec.shape, dtype=spec.dtype) for spec in self.plan.params]
        turns = [threading.Event() for _ in self.clients]

        def one(s: int, c: Client) -> tuple[PushAck, Pulled]:
            if s:
                turns[s - 1].wait()
            try:
                ack = c.push(
                    seq, parts[s], self.plan.views(dense, s), num_samples=num_samples, local_steps=local_steps
                )
            finally:
                turns[s].set()  # also after a failure: the next server's push must not wait for ever
            return ack, c.pull(out=self.plan.views(out, s))

        done = self._each(one)
        return (
            PushAck([v for a, _ in done for v in a.versions], all(a.applied for a, _ in done)),
            Pulled([v for _, p in done for v in p.versions], out),
        )

    def _split(self, versions: Sequence[int] | None) -> list[Sequence[int] | None]:
        if versions is None:
            return [None] * len(self.clients)
        versions = list(versions)
        if len(versions) != self.num_shards:
            raise ValueError(
                f"pulled_versions has {len(versions)} entries; the servers hold {self.num_shards} "
                "shards: pass the versions pull() returned."
            )
        return [
            versions[end - width : end]
            for width, end in zip(self._widths, itertools.accumulate(self._widths))
        ]

    def close(self) -> None:
        try:
            for c in self.clients:
                c.close()
        finally:
            self._pool.shutdown(wait=False)
