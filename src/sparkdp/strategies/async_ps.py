"""Asynchronous training through the parameter server (Dpplee3 / Downpour / EASGD / DC-ASGD).

Each worker is an ordinary Spark task (so Spark can retry it) that trains with its
**own** optimizer and talks to the server at its own pace — *multi-granular*
interaction (Dpplee3): it pushes every ``push_every`` local batches (an int or
``"epoch"``) and pulls every ``pull_every``. What it pushes is declared by the update
rule (``UpdateRule.pushes``, docs/algorithms.md §3): for the ASGD family and DC-ASGD the
pseudo-gradient ``(w_ref - w_local) / (lr_w * k)`` (ADAG normalisation: equal to the
gradient for k = 1 and a plain SGD worker, so the server learning rate need not change
with k); for DDC-ASGD, which applies its own momentum, the mean raw gradient of the k
steps; for EASGD the elastic difference. The server applies it with the rule (and, for ASGD, the
**server's** optimizer) — worker and server optimizers are separate objects.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any, Literal

import torch
from torch import nn

from ..comm.base import Collective
from ..comm.single import SingleProcessCollective
from ..config import check_int
from ..errors import ConfigError
from ..rules import PushKind, RuleSpec
from ..rules.functional import pseudo_gradient
from .base import Launcher, Strategy

log = logging.getLogger(__name__)


Every = int | Literal["epoch"]  # batches between exchanges, or once an epoch


def _every(name: str, value: int | str) -> Every:
    if value == "epoch":
        return "epoch"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive number of batches or 'epoch'; got {value!r}.")
    return value


class AsyncParameterServer(Strategy):
    """Asynchronous data parallelism around a sharded, authenticated parameter server.

    Args:
        rule: update rule name (``asgd``, ``hogwild``, ``easgd``, ``dcasgd``, ``ddcasgd``,
            ``sa-asgd``, ...; see :data:`sparkdp.rules.RULES`).
        rule_options: the rule's hyper-parameters, e.g. ``{"lr": 0.05}`` — the
            **server** learning rate — or ``{"server_optimizer": "adam"}`` for ASGD.
            ``num_workers`` is filled in from the job.
        push_every: local batches between pushes (int) or ``"epoch"``. Raise it to cut
            traffic (each push moves the whole model); keep it small if the loss is
            noisy or workers diverge.
        pull_every: local batches between pulls (default: same as ``push_every``).
        num_shards: lock shards inside each server process (default: about one per 8 MiB of its
            part of the model): concurrent pushes are applied in parallel.
        servers: None (default): one server, on the driver. K >= 1: K server tasks on the
            executors, beside the workers, each holding one byte-balanced K-th of the model on
            its own host's link (docs/guide/strategies.md, "Servers on the executors"); the job then
            needs ``workers + K`` task slots at once.
        mac_payload: also authenticate tensor bytes (closes on-path tampering; costs
            about half the bandwidth); ``tls``: encrypt the connection.
        connect_timeout_s: how long a worker waits for the server.
        max_push_norm: refuse (and fail the pushing task with) a push whose L2 norm is above this
            (with ``servers=K``, each server bounds the norm of its part); None (default): no bound.
            Whatever this is, the server refuses a push that would make the centre non-finite.
    """

    launcher = Launcher.TASKS
    comm_is_own = True  # pushes and pulls cross this worker's own link and wait for no peer
    # the server's shards are flat views of NCHW parameters; batches still go channels-last
    channels_last_weights = False

    def __init__(
        self,
        rule: str = "asgd",
        rule_options: dict[str, Any] | None = None,
        *,
        push_every: int | str = 1,
        pull_every: int | str | None = None,
        num_shards: int | None = None,
        servers: int | None = None,
        mac_payload: bool = False,
        tls: bool = False,
        connect_timeout_s: float = 30.0,
        max_push_norm: float | None = None,
    ) -> None:
        super().__init__()
        options = dict(rule_options or {})
        # validate name and hyper-parameters now, on the driver (num_workers is a placeholder here)
        self.rule = RuleSpec(rule, {"num_workers": options.pop("num_workers", 2), **options}).name
        self.rule_options = options
        self.name = rule
        self.push_every = _every("push_every", push_every)
        self.pull_every = _every("pull_every", push_every if pull_every is None else pull_every)
        check_int("num_shards", num_shards, optional=True)
        self.num_shards = num_shards
        if servers is not None and (isinstance(servers, bool) or not isinstance(servers, int) or servers < 1):
            raise ConfigError(
                f"servers must be None (one server, on the driver) or a positive number of server "
                f"tasks on the executors; got {servers!r}."
            )
        self.servers = servers
        self.mac_payload = bool(mac_payload)
        self.tls = bool(tls)
        self.connect_timeout_s = float(connect_timeout_s)
        if max_push_norm is not None and (
            isinstance(max_push_norm, bool)
            or not isinstance(max_push_norm, (int, float))
            or not 0 < max_push_norm < float("inf")
        ):
            raise ConfigError(
                f"max_push_norm must be None (no bound) or a finite number > 0: the largest L2 norm a "
                f"push may have; got {max_push_norm!r}."
            )
        self.max_push_norm = None if max_push_norm is None else float(max_push_norm)
        #: the server worker id to connect as; None: the task's rank (a process a worker started
        #: has one of its own, ``train.children``)
        self.worker_id: int | None = None

    def rule_spec(self, num_workers: int) -> RuleSpec:
        return RuleSpec(self.rule, {"num_workers": num_workers, **self.rule_options})

    def connect_to(self, transport: Any, info: Any, *, offer_centre: bool = False) -> AsyncParameterServer:
        """Where the workers find the server: a transport and its ``ConnectInfo`` (set by the driver
        before the strategy is shipped; a TCP transport in Spark tasks, the in-process one in tests).
        ``offer_centre``: the server started without a centre and takes the first worker's model
        (``sparkdp.run``, where the model is built inside the user's function)."""
        self._server = (transport, info)
        self._offer_centre = offer_centre
        return self

    @property
    def server_link(self) -> tuple[Any, Any] | None:
        """The transport and ``ConnectInfo`` :meth:`connect_to` set (None before it): what a
        process a worker starts needs to join the same server (``train.children``)."""
        return getattr(self, "_server", None)

    @property
    def offers_centre(self) -> bool:
        """Whether the server takes the first worker's model as its centre (``connect_to``)."""
        return bool(getattr(self, "_offer_centre", False))

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, collective: Collective) -> nn.Module:
        """Connect as worker ``collective.rank``, pull the centre, and hook the exchanges onto the
        optimizer's steps."""
        if getattr(self, "_server", None) is None:
            raise ConfigError(
                f"the asynchronous strategy {self.name!r} needs the parameter server a sparkdp job "
                "starts: train through sparkdp.fit, sparkdp.run or sparkdp launch."
            )
        transport, info = self._server
        offer = (
            {"initial": [p.detach() for p in model.parameters()]}
            if getattr(self, "_offer_centre", False)
            else {}
        )
        worker = collective.rank if self.worker_id is None else self.worker_id
        self._client = transport.connect(
            info.address, info.secret, worker, timeout=self.connect_timeout_s, tls_cert=info.tls_cert, **offer
        )
        self._worker = AsyncWorker(self, self._client, model, optimizer, collective.world_size)
        self._attach(model, optimizer, collective)
        self._pending = 0
        return model

    def add_samples(self, n: int) -> None:
        self._pending = n

    def after_step(self) -> None:
        self._worker.after_step(self._pending)

    def end_epoch(self) -> None:
        self._worker.end_epoch()

    def finish(self) -> None:
        if getattr(self, "_worker", None) is None:  # setup never connected: nothing to push or close
            super().finish()
            return
        try:
            self._worker.finish()
        finally:
            self._client.close()
            super().finish()

    def evaluation(self, collective: Collective, last: bool) -> tuple[nn.Module, Collective] | None:
        """Worker 0 evaluates the server's centre on all the test data as it finishes an epoch (the
        others go on); after the last epoch the driver evaluates the final centre instead.

        The centre comes over worker 0's own connection as an observer's pull: a second connection
        would take one more handshake slot and could be refused while the server is busy, and an
        ordinary pull would move worker 0's staleness version and its DC-ASGD backup."""
        if collective.rank != 0 or last:
            return None
        centre = self._client.pull(observe=True).tensors
        model = copy.deepcopy(self.unwrap())
        with torch.no_grad():
            for p, c in zip(model.parameters(), centre, strict=True):
                p.copy_(c)
        return model, SingleProcessCollective()

    def comm_stats(self) -> dict[str, float]:
        w = getattr(self, "_worker", None)
        if w is None:
            return super().comm_stats()
        # dense pushes and pulls move the whole model each
        return {
            "comm_s": w.comm_s,
            "bytes_sent": w.pushes * w.model_bytes,
            "bytes_recv": w.pulls * w.model_bytes,
        }

    def metrics(self) -> dict[str, Any]:
        w = self._worker
        return {"pushes": w.pushes, "pulls": w.pulls, "comm_s": w.comm_s}

    def __getstate__(self) -> dict[str, Any]:
        # a worker's connection and loop state stay in its task; the server address travels
        return {k: v for k, v in self.__dict__.items() if k not in ("_client", "_worker", "_hook")}

    def options(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "rule_options": self.rule_options,
            "push_every": self.push_every,
            "pull_every": self.pull_every,
            "num_shards": self.num_shards,
            "servers": self.servers,
            "mac_payload": self.mac_payload,
            "tls": self.tls,
            "max_push_norm": self.max_push_norm,
        }


class AsyncWorker:
    """The worker side of one task: local steps, pushes and pulls at the configured granularity.

    What is pushed is the rule's declared :class:`~sparkdp.rules.PushKind`: the worker
    optimizer's pseudo-gradient, the mean raw gradient of the local steps, or the elastic
    difference to a freshly pulled centre.
    """

    def __init__(
        self,
        strategy: AsyncParameterServer,
        client: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        num_workers: int,
    ) -> None:
        self.s = strategy
        self.client = client
        self.model = model
        self.optimizer = optimizer
        self.params = [p for p in model.parameters()]
        self.rule = strategy.rule_spec(num_workers).create()
        self.kind = self.rule.pushes
        self.elastic = self.kind is PushKind.ELASTIC  # needs the centre *before* computing its push
        self.seq = client.last_seq + 1  # a retried task continues its predecessor's numbering
        self.pushes = 0
        self.pulls = 0
        self.comm_s = 0.0
        self.model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.versions: list[int] = []
        self._since_push = 0
        self._since_pull = 0
        self._samples = 0
        # PushKind.GRADIENT: the sum of the gradients since the last push
        self._grad_sum = (
            [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
            if self.kind is PushKind.GRADIENT
            else []
        )
        # A model in shared memory that other processes train too (Hogwild! inside a machine,
        # train.children) moves with their steps and pulls: this worker's pseudo-gradient is then
        # the sum of its own steps' changes, each measured around its step.
        self._own: list[torch.Tensor] = []
        self._before: list[torch.Tensor] = []
        self._pre_hook = None
        if any(p.is_shared() for p in self.params):
            if self.elastic:
                raise ConfigError(
                    f"{strategy.name!r} pushes the elastic difference between the model and the "
                    "centre, which processes sharing one model would each push again; with a model "
                    "in shared memory use asgd, hogwild, dcasgd or ddcasgd, or one process per worker."
                )
            if self.kind is PushKind.PSEUDO_GRADIENT:
                self._own = [torch.zeros_like(p, memory_format=torch.contiguous_format) for p in self.params]
                self._pre_hook = optimizer.register_step_pre_hook(
                    lambda _opt, _args, _kwargs: self._before_step()
                )
        self.pull(merge=True)

    @torch.no_grad()
    def _before_step(self) -> None:
        self._before = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def _add_own_step(self) -> None:
        for own, before, p in zip(self._own, self._before, self.params, strict=True):
            own.add_(before - p.detach())

    def pull(self, merge: bool) -> list[torch.Tensor]:
        started = time.perf_counter()
        versions, center = self.client.pull()
        return self._pulled(versions, center, merge, started)

    def _pulled(
        self, versions: list[int], center: list[torch.Tensor], merge: bool, started: float
    ) -> list[torch.Tensor]:
        self.versions = versions
        if self.params and self.params[0].device.type != "cpu":  # the wire carries CPU tensors
            center = [c.to(p.device, non_blocking=True) for c, p in zip(center, self.params, strict=True)]
        self.pulls += 1
        self.comm_s += time.perf_counter() - started
        if merge:
            with torch.no_grad():
                self.rule.merge(self.params, center)
            if self.kind is PushKind.PSEUDO_GRADIENT:
                self._ref = [p.detach().clone() for p in self.params]
        self._since_pull = 0
        return center

    def after_step(self, num_samples: int) -> None:
        """Call after each local optimizer step (the step's gradients still in ``.grad``)."""
        if self.kind is PushKind.GRADIENT:
            self._add_gradients()
        elif self._own:
            self._add_own_step()
        self._since_push += 1
        self._since_pull += 1
        self._samples += num_samples
        if self.s.push_every != "epoch" and self._since_push >= self.s.push_every:
            self.exchange()
        elif self.s.pull_every != "epoch" and self._since_pull >= self.s.pull_every and not self.elastic:
            self.pull(merge=True)

    @torch.no_grad()
    def _add_gradients(self) -> None:
        for total, p in zip(self._grad_sum, self.params, strict=True):
            if p.grad is not None:  # a parameter the loss does not reach contributes zeros
                total.add_(p.grad)

    def end_epoch(self) -> None:
        if self.s.push_every == "epoch" or self.s.pull_every == "epoch":
            self.exchange(force_pull=True)

    def finish(self) -> None:
        if self._since_push:
            self.exchange(force_pull=False)
        if self._pre_hook is not None:
            self._pre_hook.remove()

    def _payload(self, k: int) -> list[torch.Tensor]:
        with torch.no_grad():
            if self.elastic:
                center = self.pull(merge=False)
                return self.rule.make_push(self.params, center, [])
            if self.kind is PushKind.GRADIENT:
                return self.rule.make_push(self.params, [], [t.div_(k) for t in self._grad_sum])
            lr = float(self.optimizer.param_groups[0]["lr"]) or 1.0
            if self._own:  # this process's own steps: (w_pulled - w_local) of them alone
                grads = [own / (lr * k) for own in self._own]
            else:
                grads = pseudo_gradient(self._ref, [p.detach() for p in self.params], lr, k)
            return self.rule.make_push(self.params, self._ref, grads)

    def exchange(self, force_pull: bool = False) -> None:
        k = max(self._since_push, 1)
        payload = self._payload(k)
        due = self.s.pull_every != "epoch" and self._since_pull >= self.s.pull_every
        pull = not self.elastic and (due or force_pull)
        started = time.perf_counter()
        if pull and hasattr(self.client, "exchange"):  # several servers: push and pull pipelined
            _, (versions, center) = self.client.exchange(
                self.seq, self.versions, payload, num_samples=self._samples, local_steps=k
            )
        else:
            self.client.push(self.seq, self.versions, payload, num_samples=self._samples, local_steps=k)
        self.comm_s += time.perf_counter() - started
        for t in (*self._grad_sum, *self._own):
            t.zero_()
        self.seq += 1
        self.pushes += 1
        self._since_push = 0
        self._samples = 0
        if pull and hasattr(self.client, "exchange"):
            self._pulled(versions, center, True, time.perf_counter())
        elif pull:
            self.pull(merge=True)
        elif self.kind is PushKind.PSEUDO_GRADIENT:
            self._ref = [p.detach().clone() for p in self.params]
