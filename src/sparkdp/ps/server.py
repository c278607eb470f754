"""The parameter server: centre tensors, per-shard versions and locks, idempotent pushes.

Mechanism only (design rule 1, docs/architecture.md): the math is the :class:`~sparkdp.rules.base.UpdateRule`
(one instance per shard), the bytes are a transport's job.

Staleness, per shard (defined in docs/algorithms.md §0): ``tau_s = t_s - v``, the shard's
version when this push is applied (before its own increment) less the version ``v`` the push
says the worker pulled.  The staleness histogram counts one entry per push, ``max_s tau_s``.

Locking, per shard, from ``rule.locking`` (or the ``locking`` override):
``GLOBAL`` — apply, on_pull and the pull copy run under the shard's mutex, so no update
is lost and pulls are consistent per shard; ``NONE`` (Hogwild!) — no lock: updates may
be lost and pulls torn, by design; only the version ticket is atomic.  Every lock is
taken through ``with``, so an exception inside ``rule.apply`` never leaves it held
(design rule 2, docs/architecture.md).

Idempotency: each push carries ``(worker, seq)``.  A push whose seq is at most the last
seq applied for that worker is acknowledged (``applied=False``) but not applied, so a
retried or speculative Spark task never applies twice.  A restarted task resumes at
``last_seq(worker) + 1`` (the TCP handshake reports it).

Rules: the tensors of a :class:`Push` are valid only during ``apply`` (over TCP they are
views into a receive buffer reused for the next push); a rule that keeps one must clone
it.  Server-side rules see each shard as a list of 1-D pieces (see ``sharding``).

Example:
    >>> import torch
    >>> from sparkdp.rules.base import UpdateRule
    >>> class SGD(UpdateRule):
    ...     def apply(self, center, push):
    ...         for c, g in zip(center, push.tensors):
    ...             c.sub_(g, alpha=0.5)
    >>> ps = ParameterServer(lambda shard: SGD(), [torch.zeros(3)])
    >>> versions, center = ps.pull(worker=0)
    >>> ps.push(0, seq=0, pulled_versions=versions, tensors=[torch.ones(3)]).versions
    [1]
    >>> ps.pull(worker=0).tensors[0]
    tensor([-0.5000, -0.5000, -0.5000])
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sparkdp.errors import ConfigError, SparkdpError
from sparkdp.ps.sharding import MIN_SPLIT_BYTES, ShardPlan
from sparkdp.rules.base import Locking, Push, UpdateRule

_METRICS = ("pulls", "pushes_applied", "duplicates_dropped", "rejected", "bytes_in", "bytes_out")


class VersionCounter:
    """A shard's version: read-and-increment is atomic even when the shard is lock-free.

    Under Hogwild the apply itself is unlocked, but two pushes must never get the same
    version ticket (dist-keras increments ``num_updates`` outside its mutex, a race on
    the staleness counter — design rule 2).  The tiny lock here guards only the integer.
    """

    def __init__(self) -> None:
        self._value = 0
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def ticket(self) -> int:
        """Increment and return the version *before* the increment."""
        with self._lock:
            before = self._value
            self._value = before + 1
            return before

    def set(self, value: int) -> None:
        with self._lock:
            self._value = int(value)


class PushRejected(SparkdpError, ValueError):
    """A push the server refused (NaN/Inf, wrong shapes or dtypes, bad versions); nothing was applied."""


class Pulled(NamedTuple):
    versions: list[int]  # per requested shard, the version copied
    tensors: list[Tensor]  # parameter-shaped copies of the centre


class PushAck(NamedTuple):
    versions: list[int]  # every shard's version after this push
    applied: bool  # False: a duplicate (worker, seq), acknowledged but not applied again


def all_finite(t: Tensor) -> bool:
    """True when ``t`` has no NaN/Inf.

    Fast path: a sum is non-finite whenever any element is, and summing is one
    read-only pass (~30x faster than ``isfinite(t).all()`` on 100M floats here).  A
    non-finite sum can also be an overflow of finite values, so only then check exactly.
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


class ParameterServer:
    """Holds the centre variable and folds pushes into it with one rule per shard.

    Args:
        rule_factory: ``rule_factory(shard_index) -> UpdateRule``; called once per shard.
        params: initial centre tensors (copied; the caller's tensors are never touched).
        num_shards: ``None`` = automatic (~1 per 8 MiB, at most 8; see
            :mod:`sparkdp.ps.sharding`). Raise it if many workers wait on one lock.
        locking: override the rules' declared :class:`Locking` (e.g. force ``GLOBAL``).
        min_split_bytes: tensors below this are never split across shards.
    """

    def __init__(
        self,
        rule_factory: Callable[[int], UpdateRule],
        params: Sequence[Tensor],
        *,
        num_shards: int | None = None,
        locking: Locking | str | None = None,
        min_split_bytes: int = MIN_SPLIT_BYTES,
    ) -> None:
        self.plan = ShardPlan.build(list(params), num_shards, min_split_bytes=min_split_bytes)
        self._center = [p.detach().to("cpu").clone(memory_format=torch.contiguous_format) for p in params]
        self._rules: list[UpdateRule] = []
        for s in range(self.plan.num_shards):
            rule = rule_factory(s)
            if not isinstance(rule, UpdateRule):
                raise ConfigError(
                    f"rule_factory({s}) returned {type(rule).__name__}, expected an UpdateRule instance."
                )
            self._rules.append(rule)
        self.locking = [Locking(locking if locking is not None else r.locking) for r in self._rules]
        self._locks = [threading.Lock() if k is Locking.GLOBAL else contextlib.nullcontext()
                       for k in self.locking]  # nullcontext: Hogwild's shards take no lock
        self._versions = [VersionCounter() for _ in self._rules]
        self._views = [self.plan.views(self._center, s) for s in range(self.plan.num_shards)]
        self._book = threading.Lock()  # guards the per-worker books and the metrics below
        self._last_seq: dict[int, int] = {}
        self._last_pulled: dict[int, list[int]] = {}
        self._counts: Counter[str] = Counter()
        self._staleness: Counter[int] = Counter()

    # ------------------------------------------------------------------ queries
    @property
    def num_shards(self) -> int:
        return self.plan.num_shards

    def versions(self) -> list[int]:
        return [v.value for v in self._versions]

    def last_seq(self, worker: int) -> int:
        """Last applied push seq of ``worker`` (-1 if none): a restarted task continues after it."""
        with self._book:
            return self._last_seq.get(worker, -1)

    def metrics(self) -> dict[str, Any]:
        """Snapshot: pulls, pushes_applied, duplicates_dropped, rejected, bytes_in, bytes_out, staleness."""
        with self._book:
            return {**{k: self._counts[k] for k in _METRICS}, "staleness": dict(sorted(self._staleness.items()))}

    # ------------------------------------------------------------------ pull / push
    def pull(
        self, worker: int, shards: Sequence[int] | None = None, *, out: Sequence[Tensor] | None = None,
        observe: bool = False,
    ) -> Pulled:
        """Copy the centre (the requested shards of it) for ``worker``.

        ``out`` (parameter-shaped contiguous tensors) is filled instead of allocating;
        regions of unrequested shards are left as they were (zeros when allocated here).
        ``observe``: a look at the centre that is not ``worker``'s pull (evaluation): its
        pulled versions (staleness) and the rule's ``on_pull`` (DC-ASGD's backup) stay as they were.
        """
        worker = check_worker(worker)
        wanted = self._check_shards(shards)
        if out is None:
            out = [torch.zeros(spec.shape, dtype=spec.dtype) for spec in self.plan.params]
        else:
            self.plan.check(out, "pull(out=...)")
            if not all(t.is_contiguous() for t in out):
                raise ValueError("pull(out=...) needs contiguous tensors.")
        versions = []
        for s in wanted:
            dst = self.plan.views(out, s)
            with self._locks[s]:
                versions.append(self._versions[s].value)
                if not observe:
                    self._rules[s].on_pull(worker, self._views[s])
                for d, c in zip(dst, self._views[s], strict=True):
                    d.copy_(c)
        shard_bytes = self.plan.shard_bytes()
        nbytes = sum(shard_bytes[s] for s in wanted)
        with self._book:
            if not observe:
                record = self._last_pulled.setdefault(worker, [0] * self.num_shards)
                for s, v in zip(wanted, versions, strict=True):
                    record[s] = v
            self._counts["pulls"] += 1
            self._counts["bytes_out"] += nbytes
        return Pulled(versions, list(out))

    def push(
        self,
        worker: int,
        seq: int,
        pulled_versions: Sequence[int] | None,
        tensors: Sequence[Tensor],
        num_samples: int = 1,
        local_steps: int = 1,
    ) -> PushAck:
        """Apply ``worker``'s push number ``seq`` unless already applied.

        ``pulled_versions``: per shard, the version the worker's tensors were computed
        from (what :meth:`pull` returned); ``None`` uses the server's record of the
        worker's last pull.  Raises :class:`PushRejected` (nothing applied) on NaN/Inf,
        wrong shapes/dtypes or impossible versions.
        """
        worker = check_worker(worker)
        if type(seq) is not int or seq < 0:
            raise PushRejected(f"push from worker {worker}: seq must be an int >= 0, got {seq!r}.")
        if type(num_samples) is not int or num_samples < 0 or type(local_steps) is not int or local_steps < 1:
            raise PushRejected(
                f"push from worker {worker}: num_samples must be an int >= 0 and local_steps an int >= 1, "
                f"got {num_samples!r} and {local_steps!r}."
            )
        try:
            pulled = self._check_push(worker, pulled_versions, tensors)
        except PushRejected:
            with self._book:
                self._counts["rejected"] += 1
            raise
        with self._book:  # check-and-reserve seq atomically: a concurrent twin task sees it taken
            if seq <= self._last_seq.get(worker, -1):
                self._counts["duplicates_dropped"] += 1
                return PushAck(self.versions(), False)
            self._last_seq[worker] = seq
        tensors = [t.contiguous() for t in tensors]
        taus, new_versions = [], []
        for s in range(self.num_shards):
            pushed = tuple(self.plan.views(tensors, s))
            with self._locks[s]:
                version = self._versions[s].ticket()
                taus.append(version - pulled[s])
                self._rules[s].apply(self._views[s], Push(worker, taus[-1], pushed, num_samples, local_steps))
            new_versions.append(version + 1)
        with self._book:
            self._counts["pushes_applied"] += 1
            self._counts["bytes_in"] += sum(t.numel() * t.element_size() for t in tensors)
            self._staleness[max(taus)] += 1
        return PushAck(new_versions, True)

    def _check_push(
        self, worker: int, pulled_versions: Sequence[int] | None, tensors: Sequence[Tensor]
    ) -> list[int]:
        try:
            self.plan.check(tensors, f"push from worker {worker}")
        except ValueError as exc:
            raise PushRejected(str(exc)) from None
        if pulled_versions is None:
            with self._book:
                record = self._last_pulled.get(worker)
            if record is None:
                raise PushRejected(
                    f"push from worker {worker} without pulled_versions, and worker {worker} never pulled."
                )
            pulled = list(record)
        else:
            try:
                pulled = list(pulled_versions)
            except TypeError:  # e.g. a number off the wire: a rejected push, not a server error
                pulled = None
        now = self.versions()
        if pulled is None or len(pulled) != self.num_shards or not all(
            type(v) is int and 0 <= v <= n for v, n in zip(pulled, now, strict=True)
        ):
            raise PushRejected(
                f"push from worker {worker}: pulled_versions={pulled_versions if pulled is None else pulled!r:.200} "
                f"must be {self.num_shards} ints, each between 0 and the shard's current version {now}; pass the versions pull() returned."
            )
        for i, t in enumerate(tensors):
            if not all_finite(t):
                raise PushRejected(
                    f"push from worker {worker}: tensor {i} contains NaN or Inf; rejected, the centre keeps its "
                    "last good value. Lower the learning rate or clip gradients on that worker."
                )
        return pulled

    def _check_shards(self, shards: Sequence[int] | None) -> list[int]:
        if shards is None:
            return list(range(self.num_shards))
        wanted = list(shards)
        if not all(type(s) is int and 0 <= s < self.num_shards for s in wanted) or len(set(wanted)) != len(
            wanted
        ):
            raise ValueError(f"shards={wanted!r:.200}: expected distinct ints in [0, {self.num_shards}).")
        return wanted

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Centre, versions, per-worker books and each shard's rule state (consistent per shard)."""
        center = [torch.empty_like(c) for c in self._center]
        versions, rules = [], []
        for s in range(self.num_shards):
            with self._locks[s]:
                for d, c in zip(self.plan.views(center, s), self._views[s], strict=True):
                    d.copy_(c)
                versions.append(self._versions[s].value)
                rules.append(self._rules[s].state_dict())
        with self._book:
            books = {
                "last_seq": dict(self._last_seq),
                "last_pulled": {w: list(v) for w, v in self._last_pulled.items()},
            }
        return {"plan": self.plan.to_json(), "center": center, "versions": versions, "rules": rules, **books}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s state; ``ValueError`` (nothing loaded) for state that is not
        a server's, ``ConfigError`` for another model's or shard layout's."""
        if not isinstance(state, dict) or set(state) != STATE_KEYS:
            found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a parameter server's state (its keys: {found}; a server's state has "
                             f"{sorted(STATE_KEYS)}).")
        if ShardPlan.from_json(state["plan"]) != self.plan:
            raise ConfigError(
                "checkpoint was written for a different model or shard layout; build the ParameterServer "
                "with the same parameters and num_shards as the run that saved it."
            )
        self.plan.check(state["center"], "checkpoint centre")
        for s in range(self.num_shards):
            with self._locks[s]:
                for c, src in zip(
                    self._views[s], self.plan.views([t.contiguous() for t in state["center"]], s), strict=True
                ):
                    c.copy_(src)
                self._versions[s].set(state["versions"][s])
                self._rules[s].load_state_dict(state["rules"][s])
        with self._book:
            self._last_seq = {int(w): int(v) for w, v in state["last_seq"].items()}
            self._last_pulled = {int(w): [int(x) for x in v] for w, v in state["last_pulled"].items()}


#: the keys of :meth:`ParameterServer.state_dict` (what a server checkpoint holds)
STATE_KEYS = frozenset({"plan", "center", "versions", "rules", "last_seq", "last_pulled"})


def check_worker(worker: object) -> int:
    """``worker`` if it is a valid worker id (an int >= 0); ``ValueError`` otherwise."""
    if type(worker) is not int or worker < 0:
        raise ValueError(f"worker id must be an int >= 0, got {worker!r}.")
    return worker
