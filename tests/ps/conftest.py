"""Tiny rules of our own (independent of sparkdp.rules' concrete rules) and TCP fixtures."""

from __future__ import annotations

import pytest
import torch

from sparkdp.ps import ParameterServer
from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.rules.base import Locking, UpdateRule


class Sub(UpdateRule):
    """center -= lr * g, under the locking given."""

    def __init__(self, lr: float = 1.0, locking: Locking = Locking.GLOBAL) -> None:
        self.lr, self.locking, self.applied = lr, locking, 0

    def apply(self, center, push):
        for c, g in zip(center, push.tensors, strict=True):
            c.sub_(g, alpha=self.lr)
        self.applied += 1

    def state_dict(self):
        return {"applied": self.applied, "per_worker": {3: torch.arange(4.0)}}

    def load_state_dict(self, state):
        self.applied = state["applied"]
        self.per_worker = state["per_worker"]


class Recorder(Sub):
    """Records each push's staleness (to check tau against the definition)."""

    def __init__(self) -> None:
        super().__init__()
        self.taus: list[tuple[int, int]] = []

    def apply(self, center, push):
        super().apply(center, push)
        self.taus.append((push.worker, push.staleness))


def make_ps(shapes=((3,),), num_shards=None, rule=Sub, **kw) -> ParameterServer:
    return ParameterServer(lambda s: rule(), [torch.zeros(s) for s in shapes], num_shards=num_shards, **kw)


@pytest.fixture
def tcp():
    """serve(ps, **opts) -> endpoint; every endpoint is closed after the test."""
    endpoints = []

    def serve(ps, options: TcpOptions | None = None, **kw):
        ep = TcpTransport(options).serve(ps, **kw)
        endpoints.append(ep)
        return ep

    yield serve
    for ep in endpoints:
        ep.close()


def connect(ep, worker: int, options: TcpOptions | None = None, **kw):
    return TcpTransport(options).connect(
        ep.address, ep.info.secret, worker, timeout=10, tls_cert=ep.info.tls_cert, **kw
    )
