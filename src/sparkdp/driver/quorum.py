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
    _lost_since_decision: bool = False

    def arrive(self, worker: int, arrival: Arrival) -> dict[int, Decision]:
        """``worker`` at a boundary; the decisions for every waiting worker once all are in
        (empty while the quorum still waits). Raises ``ProtocolError`` for an arrival out of step."""
        if not 0 <= worker < self.workers:
            raise ProtocolError(f"worker {worker} is not one of this job's 0..{self.workers - 1}.")
        if self.done:
            return {worker: Decision(self.number, (), self.step, False, done=True)}
        if not self.started and arrival.step == JOINING:  # a retried task before the first step
            arrival = Arrival(self.step)
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
        if worker not in self.members or self.done:
            return {}
        self.members = tuple(m for m in self.members if m != worker)
        self._lost_since_decision = True
        self.records.append(
            {"worker": worker, "step": self.step, "kind": "leave", "cause": cause, "time": time.time()}
        )
        return self._decide() if self._ready() else {}

    def _ready(self) -> bool:
        if not self.started:
            return len(self.arrived) == self.workers
        return all(m in self.arrived for m in self.members)

    def _decide(self) -> dict[int, Decision]:
        survivors = self.members if self.started else tuple(sorted(self.arrived))
        joiners = tuple(sorted(w for w in self.arrived if w not in survivors))
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
            decisions.update({w: Decision(self.number, (), self.step, False, done=True) for w in joiners})
            self.arrived.clear()
            return decisions
        members = survivors + joiners
        if members != self.members or not all(ran) or not self.started or self._lost_since_decision:
            self.number += 1
        healer = survivors[0] if joiners and self.started else None
        for joiner in joiners if healer is not None else ():
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
        self.arrived.clear()
        return {
            w: Decision(
                self.number,
                members,
                self.step,
                commit,
                heal_to=joiners if w == healer else (),
                heal_from=healer if w in joiners else None,
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
