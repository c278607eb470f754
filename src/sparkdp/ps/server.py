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
``last_seq(worker) + 1`` (the TCP handshake reports it).  A worker numbers its pushes one by
one from there and numbers the next only once the last was acknowledged, so a seq above
``last_seq(worker) + 1`` never comes from an honest worker: it is refused (and logged), since
accepting it would make that worker's own later pushes "duplicates" dropped silently.

Worker ids: ``worker_ids=N`` accepts ids ``0..N-1`` only (the job's workers and the processes
they start, ``train.children``); any other id is refused before the server keeps anything for
it, so per-worker books and rule state (DC-ASGD's backups) stay bounded by the job.

Bounds on what a push does: ``max_push_norm`` refuses a push whose L2 norm (over all its
tensors) is above it.  After every applied push the centre is checked finite; a push that
would make it non-finite is refused and the centre and the rules' state left as they were.
Only a push or centre with values of magnitude above :data:`OVERFLOW_RISK` can overflow a
rule's arithmetic (its coefficients being far below ``3e38 / OVERFLOW_RISK**3``), so only such
a push is applied on a backup it can be rolled back to (under every shard's lock at once);
others cost one read pass over the shard for the check.

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
import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from sparkdp.errors import ConfigError, SparkdpError
from sparkdp.ps.sharding import MIN_SPLIT_BYTES, ShardPlan
from sparkdp.rules.base import Locking, Push, UpdateRule

log = logging.getLogger(__name__)
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


#: Magnitude above which a push, or the centre it lands on, is applied on a backup (see the
#: module docstring): 2**32 keeps a cube of it (DC-ASGD's g*g*(w - w_bak)) six orders of
#: magnitude below float32's largest value, and is far above any weight or gradient of a
#: model that trains.
OVERFLOW_RISK = 2.0**32


def magnitude(tensors: Sequence[Tensor]) -> float:
    """The largest ``|x|`` over ``tensors`` (NaN if any is NaN, inf if any is infinite), in one
    read pass per tensor (``aminmax`` allocates no ``abs`` copy)."""
    top = 0.0
    for t in tensors:
        if t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
            continue
        if t.is_complex():
            m = float(t.detach().abs().max())
        else:
            lo, hi = torch.aminmax(t.detach().reshape(-1))
            m = max(-float(lo), float(hi))
        if math.isnan(m):
            return math.nan
        top = max(top, m)
    return top


def _snapshot(obj: Any) -> Any:
    """A deep copy of rule state (tensors cloned; dicts, lists and tuples rebuilt)."""
    if isinstance(obj, Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


class ParameterServer:
    """Holds the centre variable and folds pushes into it with one rule per shard.

    Args:
        rule_factory: ``rule_factory(shard_index) -> UpdateRule``; called once per shard.
        params: initial centre tensors (copied; the caller's tensors are never touched).
        num_shards: ``None`` = automatic (~1 per 8 MiB, at most 8; see
            :mod:`sparkdp.ps.sharding`). Raise it if many workers wait on one lock.
        locking: override the rules' declared :class:`Locking` (e.g. force ``GLOBAL``).
        min_split_bytes: tensors below this are never split across shards.
        worker_ids: accept worker ids ``0..worker_ids-1`` only (``None``: any id); a job passes
            the ids of its workers and of the processes they start (``train.children``).
        max_push_norm: refuse a push whose L2 norm over all its tensors is above this
            (``None``: no bound).
    """

    def __init__(
        self,
        rule_factory: Callable[[int], UpdateRule],
        params: Sequence[Tensor],
        *,
        num_shards: int | None = None,
        locking: Locking | str | None = None,
        min_split_bytes: int = MIN_SPLIT_BYTES,
        worker_ids: int | None = None,
        max_push_norm: float | None = None,
    ) -> None:
        if worker_ids is not None and (type(worker_ids) is not int or worker_ids < 1):
            raise ConfigError(
                f"worker_ids must be a positive int (ids 0..worker_ids-1) or None; got {worker_ids!r}."
            )
        if max_push_norm is not None and not (
            isinstance(max_push_norm, (int, float))
            and not isinstance(max_push_norm, bool)
            and 0 < max_push_norm < math.inf
        ):
            raise ConfigError(f"max_push_norm must be a finite number > 0 or None; got {max_push_norm!r}.")
        self.worker_ids = worker_ids
        self.max_push_norm = None if max_push_norm is None else float(max_push_norm)
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
        self._locks = [
            threading.Lock() if k is Locking.GLOBAL else contextlib.nullcontext() for k in self.locking
        ]  # nullcontext: Hogwild's shards take no lock
        self._versions = [VersionCounter() for _ in self._rules]
        self._views = [self.plan.views(self._center, s) for s in range(self.plan.num_shards)]
        self._book = threading.Lock()  # guards the per-worker books and the metrics below
        self._last_seq: dict[int, int] = {}
        self._last_pulled: dict[int, list[int]] = {}
        self._counts: Counter[str] = Counter()
        self._staleness: Counter[int] = Counter()
        # per shard, the centre's largest |value| after the last push applied to it (see OVERFLOW_RISK)
        self._magnitude = [magnitude(v) for v in self._views]

    # ------------------------------------------------------------------ queries
    @property
    def num_shards(self) -> int:
        return self.plan.num_shards

    def versions(self) -> list[int]:
        return [v.value for v in self._versions]

    def accepts(self, worker: object) -> bool:
        """Whether ``worker`` is an id of this server's job (see ``worker_ids``)."""
        return type(worker) is int and 0 <= worker and (self.worker_ids is None or worker < self.worker_ids)

    def _job_worker(self, worker: object, refused: type[ValueError] = ValueError) -> int:
        worker = check_worker(worker)
        if not self.accepts(worker):
            raise refused(
                f"worker id {worker} is not one of this job's (ids 0..{(self.worker_ids or 0) - 1}); refused."
            )
        return worker

    def last_seq(self, worker: int) -> int:
        """Last applied push seq of ``worker`` (-1 if none): a restarted task continues after it."""
        with self._book:
            return self._last_seq.get(worker, -1)

    def metrics(self) -> dict[str, Any]:
        """Snapshot: pulls, pushes_applied, duplicates_dropped, rejected, bytes_in, bytes_out, staleness."""
        with self._book:
            return {
                **{k: self._counts[k] for k in _METRICS},
                "staleness": dict(sorted(self._staleness.items())),
            }

    # ------------------------------------------------------------------ pull / push
    def pull(
        self,
        worker: int,
        shards: Sequence[int] | None = None,
        *,
        out: Sequence[Tensor] | None = None,
        observe: bool = False,
    ) -> Pulled:
        """Copy the centre (the requested shards of it) for ``worker``.

        ``out`` (parameter-shaped contiguous tensors) is filled instead of allocating;
        regions of unrequested shards are left as they were (zeros when allocated here).
        ``observe``: a look at the centre that is not ``worker``'s pull (evaluation): its
        pulled versions (staleness) and the rule's ``on_pull`` (DC-ASGD's backup) stay as they were.
        """
        worker = check_worker(worker) if observe else self._job_worker(worker)
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
        worker = self._job_worker(worker, PushRejected)
        if type(seq) is not int or seq < 0:
            raise PushRejected(f"push from worker {worker}: seq must be an int >= 0, got {seq!r}.")
        if type(num_samples) is not int or num_samples < 0 or type(local_steps) is not int or local_steps < 1:
            raise PushRejected(
                f"push from worker {worker}: num_samples must be an int >= 0 and local_steps an int >= 1, "
                f"got {num_samples!r} and {local_steps!r}."
            )
        try:
            pulled, size = self._check_push(worker, pulled_versions, tensors)
        except PushRejected:
            with self._book:
                self._counts["rejected"] += 1
            raise
        with self._book:  # check-and-reserve seq atomically: a concurrent twin task sees it taken
            last = self._last_seq.get(worker, -1)
            if seq <= last:
                self._counts["duplicates_dropped"] += 1
                return PushAck(self.versions(), False)
            if seq > last + 1:
                self._counts["rejected"] += 1
                log.warning(
                    "refused push %d of worker %d: its last applied push is %d, and a worker numbers "
                    "its pushes one by one",
                    seq,
                    worker,
                    last,
                )
                raise PushRejected(
                    f"push from worker {worker}: seq {seq} jumps past {last + 1}, the next after its "
                    f"last applied push; a worker continues at last_seq + 1 (the handshake's)."
                )
            self._last_seq[worker] = seq
        tensors = [t.contiguous() for t in tensors]
        guarded = size > OVERFLOW_RISK or not max(self._magnitude) <= OVERFLOW_RISK
        try:
            apply = self._apply_guarded if guarded else self._apply
            taus, new_versions = apply(worker, pulled, tensors, num_samples, local_steps)
        except PushRejected:
            with self._book:
                self._counts["rejected"] += 1
                if guarded and self._last_seq.get(worker) == seq:  # rolled back: a retry may send it again
                    self._last_seq[worker] = last
            raise
        with self._book:
            self._counts["pushes_applied"] += 1
            self._counts["bytes_in"] += sum(t.numel() * t.element_size() for t in tensors)
            self._staleness[max(taus)] += 1
        return PushAck(new_versions, True)

    def _apply(
        self, worker: int, pulled: list[int], tensors: list[Tensor], num_samples: int, local_steps: int
    ) -> tuple[list[int], list[int]]:
        """Apply shard by shard, each under its own lock, checking each shard finite after."""
        taus, new_versions = [], []
        for s in range(self.num_shards):
            pushed = tuple(self.plan.views(tensors, s))
            with self._locks[s]:
                version = self._versions[s].ticket()
                taus.append(version - pulled[s])
                self._rules[s].apply(self._views[s], Push(worker, taus[-1], pushed, num_samples, local_steps))
                self._magnitude[s] = top = magnitude(self._views[s])
            if not math.isfinite(top):  # below OVERFLOW_RISK only a rule with huge coefficients gets here
                log.error(
                    "shard %d of the centre is not finite after push of worker %d: the rule's settings "
                    "overflow float arithmetic",
                    s,
                    worker,
                )
                raise PushRejected(
                    f"push from worker {worker} made shard {s} of the centre non-finite with "
                    f"values below {OVERFLOW_RISK:g}: the rule's coefficients are too large."
                )
            new_versions.append(version + 1)
        return taus, new_versions

    def _apply_guarded(
        self, worker: int, pulled: list[int], tensors: list[Tensor], num_samples: int, local_steps: int
    ) -> tuple[list[int], list[int]]:
        """Apply under every shard's lock on a backup of the centre and the rules' state; roll all
        shards back and refuse the push if any shard is not finite after it."""
        with contextlib.ExitStack() as held:
            for lock in self._locks:  # in shard order, as everywhere: no deadlock
                held.enter_context(lock)
            centre = [[c.clone() for c in view] for view in self._views]
            states = [_snapshot(rule.state_dict()) for rule in self._rules]
            staleness = [v.value - p for v, p in zip(self._versions, pulled, strict=True)]
            tops = []
            for s in range(self.num_shards):
                pushed = tuple(self.plan.views(tensors, s))
                self._rules[s].apply(
                    self._views[s], Push(worker, staleness[s], pushed, num_samples, local_steps)
                )
                tops.append(magnitude(self._views[s]))
            if not all(math.isfinite(t) for t in tops):
                for s in range(self.num_shards):
                    for c, saved in zip(self._views[s], centre[s], strict=True):
                        c.copy_(saved)
                    self._rules[s].load_state_dict(states[s])
                log.warning("refused push of worker %d: it would make the centre non-finite", worker)
                raise PushRejected(
                    f"push from worker {worker} would make the centre non-finite (float overflow); "
                    "refused, the centre keeps its last good value."
                )
            self._magnitude = tops
            new_versions = [v.ticket() + 1 for v in self._versions]
        return staleness, new_versions

    def _check_push(
        self, worker: int, pulled_versions: Sequence[int] | None, tensors: Sequence[Tensor]
    ) -> tuple[list[int], float]:
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
        if (
            pulled is None
            or len(pulled) != self.num_shards
            or not all(type(v) is int and 0 <= v <= n for v, n in zip(pulled, now, strict=True))
        ):
            raise PushRejected(
                f"push from worker {worker}: pulled_versions={pulled_versions if pulled is None else pulled!r:.200} "
                f"must be {self.num_shards} ints, each between 0 and the shard's current version {now}; pass the versions pull() returned."
            )
        size = 0.0
        for i, t in enumerate(tensors):
            top = magnitude([t])  # NaN or inf exactly when t is not finite
            size = max(size, top)
            if not math.isfinite(top):
                raise PushRejected(
                    f"push from worker {worker}: tensor {i} contains NaN or Inf; rejected, the centre keeps its "
                    "last good value. Lower the learning rate or clip gradients on that worker."
                )
        if self.max_push_norm is not None:
            # float32 at least: a half-precision sum of squares overflows at 256
            norm = math.sqrt(
                sum(
                    float(torch.linalg.vector_norm(t, dtype=torch.float32 if t.element_size() < 4 else None))
                    ** 2
                    for t in tensors
                    if t.is_floating_point()
                )
            )
            if not norm <= self.max_push_norm:
                raise PushRejected(
                    f"push from worker {worker}: L2 norm {norm:.4g} is above max_push_norm "
                    f"{self.max_push_norm:g}; refused, the centre keeps its last good value."
                )
        return pulled, size

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
            raise ValueError(
                f"not a parameter server's state (its keys: {found}; a server's state has "
                f"{sorted(STATE_KEYS)})."
            )
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
        self._magnitude = [magnitude(v) for v in self._views]


#: the keys of :meth:`ParameterServer.state_dict` (what a server checkpoint holds)
STATE_KEYS = frozenset({"plan", "center", "versions", "rules", "last_seq", "last_pulled"})


def check_worker(worker: object) -> int:
    """``worker`` if it is a valid worker id (an int >= 0); ``ValueError`` otherwise."""
    if type(worker) is not int or worker < 0:
        raise ValueError(f"worker id must be an int >= 0, got {worker!r}.")
    return worker
