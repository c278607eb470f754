"""Straggler and bottleneck detection from the workers' step-time split.

Every metrics record carries a worker's cumulative seconds waiting for data, computing and
communicating. Over each reporting window the detector takes a rank's *own work* per step and
scores it two ways, as NVIDIA's resiliency extension scores stragglers:

* relative: the fastest rank's own work per step over this rank's (1.0: as fast as the best);
* individual: this rank's best window over its current one (1.0: as fast as it ever was).

A rank's own work is data + compute in a synchronous job, where a fast rank's wait for a slow
one shows up as communication (so communication cannot tell who is slow), and data + compute +
communication in an asynchronous one (``comm_is_own``), where each rank's pushes and pulls
cross its own link to the server and wait for nobody.  A rank whose relative score stays
below ``threshold`` for ``patience`` windows in a row is named once, with its cause: the part
of its step (data, compute or, asynchronously, the network) furthest above the fastest rank's.

A job whose *least* communicating rank still spends more than half of its time
communicating is communication-bound (the Hopsworks study's network bottleneck); that is
said once, with what to try.  A synchronous step waits for the ring's slowest link, so
every rank shows the same share and the timings cannot name the host whose link is slow:
the message says how to find it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_PARTS = ("data_s", "compute_s", "comm_s")
_CAUSES = {  # part of a step -> (what it means, what to check)
    "data_s": (
        "slow data (waiting for batches)",
        "Check the worker's input (disk, Parquet fragments, shuffle buffer) or raise prefetch.",
    ),
    "compute_s": (
        "slow compute",
        "Check for a busy or slower machine (other processes, CPU throttling, fewer cores).",
    ),
    "comm_s": (
        "slow network (its pushes and pulls take longer)",
        "Check that worker's host link to the parameter server (bandwidth, errors, other traffic); "
        "sparkdp plan --calibrate measures the links.",
    ),
}


@dataclass
class _Rank:
    last: dict[str, float] | None = None
    window: dict[str, float] = field(default_factory=dict)  # per step, the latest window
    best_own: float = float("inf")
    host: str | None = None
    behind: int = 0
    named: bool = False


class StragglerDetector:
    """Feed it every metrics record (:meth:`update`); it returns the warnings to show."""

    def __init__(
        self,
        world_size: int,
        *,
        threshold: float = 0.67,
        patience: int = 3,
        min_steps: int = 5,
        comm_bound: float = 0.5,
        comm_min_s: float = 10.0,
        comm_is_own: bool = False,
    ) -> None:
        self.world_size, self.threshold, self.patience = world_size, threshold, patience
        self.own_parts = _PARTS if comm_is_own else _PARTS[:2]
        self.min_steps, self.comm_bound, self.comm_min_s = min_steps, comm_bound, comm_min_s
        self.ranks: dict[int, _Rank] = {}
        self.scores: dict[int, dict[str, float]] = {}
        self.comm_bound_said = False

    def update(self, record: dict[str, Any]) -> list[str]:
        rank = int(record["rank"])
        state = self.ranks.setdefault(rank, _Rank())
        state.host = record.get("host") or state.host
        now = {k: float(record.get(k, 0.0)) for k in ("steps", *_PARTS)}
        last, state.last = state.last, now
        if last is None:
            return []
        steps = now["steps"] - last["steps"]
        if steps < self.min_steps:
            state.last = last  # keep accumulating until the window has enough steps
            return []
        state.window = {k: (now[k] - last[k]) / steps for k in _PARTS}
        own = sum(state.window[k] for k in self.own_parts)
        state.best_own = min(state.best_own, own)
        return self._score(rank) + self._communication_bound()

    def _score(self, rank: int) -> list[str]:
        windows = {r: s.window for r, s in self.ranks.items() if s.window}
        if len(windows) < max(self.world_size, 2):
            return []
        own = {r: sum(w[k] for k in self.own_parts) for r, w in windows.items()}
        fastest = min(own, key=own.__getitem__)
        state = self.ranks[rank]
        relative = own[fastest] / own[rank] if own[rank] > 0 else 1.0
        individual = state.best_own / own[rank] if own[rank] > 0 else 1.0
        self.scores[rank] = {"relative": relative, "individual": individual}
        state.behind = state.behind + 1 if relative < self.threshold else 0
        if state.behind < self.patience or state.named:
            return []
        state.named = True
        mine, best = windows[rank], windows[fastest]
        cause = max(self.own_parts, key=lambda k: mine[k] - best[k])
        meaning, advice = _CAUSES[cause]
        where = f" on host {state.host}" if state.host else ""
        return [
            f"worker {rank}{where} is a straggler: {1000 * own[rank]:.1f} ms of its own work per step against "
            f"{1000 * own[fastest]:.1f} ms on worker {fastest} (relative score {relative:.2f}, individual "
            f"{individual:.2f}); cause: {meaning} ({1000 * mine[cause]:.1f} against "
            f"{1000 * best[cause]:.1f} ms per step). {advice}"
        ]

    def _communication_bound(self) -> list[str]:
        if self.comm_bound_said or len(self.ranks) < max(self.world_size, 2):
            return []
        fractions = []
        for state in self.ranks.values():
            totals = state.last or {}
            spent = sum(totals.get(k, 0.0) for k in _PARTS)
            if spent < self.comm_min_s:
                return []
            fractions.append(totals.get("comm_s", 0.0) / spent)
        if min(fractions) <= self.comm_bound:
            return []
        self.comm_bound_said = True
        where = (
            ""
            if self.own_parts == _PARTS
            else " A synchronous step waits for the slowest link, so a single slow host slows every worker alike: "
            "compare the hosts' links (their rates and errors) if some should be faster."
        )
        return [
            f"this job is communication-bound: every worker spends at least {100 * min(fractions):.0f}% of its "
            "time communicating. Communicate less often: --strategy average with a larger period "
            "(--strategy-option period=8), diloco or compression (docs/guide/strategies.md), or an "
            f"asynchronous rule (asgd, easgd) with push_every > 1.{where}"
        ]
