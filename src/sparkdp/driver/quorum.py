"""The quorum of a per-step fault-tolerant job (``fault_tolerance="step"``): who trains the next
step, and whether the last one counts. Pure bookkeeping; ``driver.quorum_server`` feeds it the
workers' messages and sends its decisions.

At every step boundary each worker of the quorum arrives with the steps it has committed and
whether its last step's collective succeeded. Once every member has arrived (or been lost: a closed
connection, a missed heartbeat, a message out of step), the quorum decides for all of them at once:

* the last step commits only when every member that ran it arrived and its collective succeeded;
  otherwise no one applies it and the next quorum runs the same step again with the same rows
  (``train.row_cursor``), so a step is applied on every worker or on none;
* the next quorum is the members that arrived, plus the workers waiting to join (a replacement
  started by Spark's task retry or by the driver), healed from the first member; each change of
  members (or a failed collective) opens a new process group, named by the quorum's number.

A joiner waits for a boundary; when no member is left to heal it from, the job cannot go on and
the quorum fails (the job's controller then decides, as for any lost stage).

Where the workers form replica groups (``replica`` > 1: hsdp's shard groups, each holding one copy
of the model sharded over its ``replica`` workers), the unit of membership is the replica group:
a lost worker takes its whole group out of the quorum at once, its live members wait as joiners
(the shards they hold are no longer in step), and the group is admitted again only whole, once
its lost worker's replacement has arrived. Each of its workers heals from the member of the same
shard index in a live group (worker ``w``'s index is ``w % replica``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError
from ..train.quorum_messages import JOINING, Arrival, Decision


@dataclass
class Quorum:
    """The quorum of a job of ``workers`` slots that ends after ``total_steps`` committed steps
    (``step``: the steps committed before it starts, a resumed job's)."""

    workers: int
    total_steps: int
    #: workers per replica group, the unit of membership (consecutive slots; 1: each worker alone)
    replica: int = 1
    members: tuple[int, ...] = ()
    #: the quorum's number: +1 at every change of members (it names the process group)
    number: int = 0
    #: job steps committed so far
    step: int = 0
    started: bool = False
    done: bool = False
    #: why the job cannot go on (no member left to heal a joiner from), once it cannot
    failed: str | None = None
    arrived: dict[int, Arrival] = field(default_factory=dict)
    #: one record per leave and per join (``membership`` of the job's result)
    records: list[dict[str, Any]] = field(default_factory=list)
    #: live workers taken out with a lost member of their replica group: they rejoin as joiners
    benched: set[int] = field(default_factory=set)
    _lost_since_decision: bool = False

    def __post_init__(self) -> None:
        if self.replica < 1 or self.workers % self.replica:
            raise ValueError(f"{self.workers} workers do not form replica groups of {self.replica}.")

    def arrive(self, worker: int, arrival: Arrival) -> dict[int, Decision]:
        """``worker`` at a boundary; the decisions for every waiting worker once all are in
        (empty while the quorum still waits). Raises ``ProtocolError`` for an arrival out of step."""
        if not 0 <= worker < self.workers:
            raise ProtocolError(f"worker {worker} is not one of this job's 0..{self.workers - 1}.")
        if self.done:
            return {worker: Decision(self.number, (), self.step, False, done=True)}
        if not self.started and arrival.step == JOINING:  # a retried task before the first step
            arrival = Arrival(self.step)
        if worker in self.benched:  # it learns it was benched from the decision that heals it
            arrival = Arrival(JOINING)
        # before the first decision every worker holds the job's start (step 0, or a resumed one)
        expected = self.step if worker in self.members or not self.started else JOINING
        if arrival.step != expected:
            raise ProtocolError(
                f"worker {worker} arrived at step {arrival.step}; the quorum expected {expected}."
            )
        self.arrived[worker] = arrival
        return self._decide() if self._ready() else {}

    def lose(self, worker: int, cause: str) -> dict[int, Decision]:
        """``worker`` is gone (``cause`` for its record); the decisions it unblocks, if any."""
        self.arrived.pop(worker, None)
        self.benched.discard(worker)  # (its replacement joins in its place)
        if worker not in self.members or self.done:
            return {}
        mates = [m for m in self.members if m != worker and self._group(m) == self._group(worker)]
        self.members = tuple(m for m in self.members if m != worker and m not in mates)
        self.benched.update(mates)
        self._lost_since_decision = True
        now = time.time()
        self.records.append(
            {"worker": worker, "step": self.step, "kind": "leave", "cause": cause, "time": now}
        )
        for mate in mates:
            why = f"worker {worker} of its replica group was lost"
            self.records.append(
                {"worker": mate, "step": self.step, "kind": "leave", "cause": why, "time": now}
            )
        return self._decide() if self._ready() else {}

    def _group(self, worker: int) -> int:
        return worker // self.replica

    def _admitted(self, waiting: tuple[int, ...]) -> tuple[int, ...]:
        """The waiting workers whose whole replica group is waiting (the others wait on)."""
        return tuple(w for w in waiting if all(m in waiting for m in self._replica_of(w)))

    def _replica_of(self, worker: int) -> range:
        first = self._group(worker) * self.replica
        return range(first, first + self.replica)

    def _healer_of(self, joiner: int, survivors: tuple[int, ...]) -> int:
        """The survivor that heals ``joiner``: the first of the same shard index."""
        return next(m for m in survivors if m % self.replica == joiner % self.replica)

    def _ready(self) -> bool:
        if not self.started:
            return len(self.arrived) == self.workers
        return all(m in self.arrived for m in self.members)

    def _decide(self) -> dict[int, Decision]:
        survivors = self.members if self.started else tuple(sorted(self.arrived))
        waiting = tuple(sorted(w for w in self.arrived if w not in survivors))
        joiners = self._admitted(waiting)
        ran = [self.arrived[m].ok for m in survivors]
        commit = self.started and bool(survivors) and not self._lost_since_decision and all(ran)
        self.step += int(commit)
        self.done = self.step >= self.total_steps
        if not survivors:
            self.failed = (
                f"every worker of the quorum was lost at step {self.step}; none is left to heal from"
            )
            self.arrived.clear()
            return {}
        if self.done:  # the joiners have nothing left to train
            decisions = {w: Decision(self.number, survivors, self.step, commit, done=True) for w in survivors}
            decisions.update({w: Decision(self.number, (), self.step, False, done=True) for w in waiting})
            self.arrived.clear()
            return decisions
        members = survivors + joiners
        if members != self.members or not all(ran) or not self.started or self._lost_since_decision:
            self.number += 1
        healers = {j: self._healer_of(j, survivors) for j in joiners} if self.started else {}
        for joiner, healer in healers.items():
            self.records.append(
                {
                    "worker": joiner,
                    "step": self.step,
                    "kind": "join",
                    "healed_from": healer,
                    "time": time.time(),
                }
            )
        self.members, self.started, self._lost_since_decision = members, True, False
        self.benched.difference_update(joiners)
        self.arrived = {w: a for w, a in self.arrived.items() if w in waiting and w not in joiners}
        return {
            w: Decision(
                self.number,
                members,
                self.step,
                commit,
                heal_to=tuple(j for j, h in healers.items() if h == w),
                heal_from=healers.get(w),
            )
            for w in members
        }

    def healed(self, worker: int, seconds: float | None, nbytes: int) -> None:
        """Note on ``worker``'s join record how long its heal took and how many bytes moved
        (``seconds`` None: the heal failed, its healer was lost)."""
        for record in reversed(self.records):
            if record["worker"] == worker and record["kind"] == "join":
                record.update(heal_s=seconds, bytes=nbytes)
                return


__all__ = ["JOINING", "Arrival", "Decision", "Quorum"]
