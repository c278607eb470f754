"""What a synchronous job's rank 0 hands back to the driver: one typed record, not a dict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import WorkerFailed
from ..state import join_parts, state_to_bytes

_BYTES = ("state", "optimizer_state")


@dataclass(frozen=True)
class WorkerReport:
    """Rank 0's result of :func:`~sparkdp.train.loop.fit_worker`.

    Attributes:
        state: the trained model's state dict as safetensors bytes; where the strategy shards the
            model, this rank's share of it (``Strategy.result_state``), which :meth:`joined` makes
            whole on the driver.
        history: one record per epoch (``epoch``, ``loss``, ``samples``, ``epoch_time_s``
            and, where evaluated, ``test_loss`` / ``test_accuracy``).
        train_time_s: seconds spent in the epochs (evaluation included).
        samples: training rows over all ranks and epochs.
        strategy_options: the strategy's settings, for logs and summaries.
        strategy_state: where the strategy is in its schedule (``Strategy.state_dict()``).
        data_counters: per-source counters summed over ranks (e.g. ``dropped_null_rows``).
        optimizer_state: the optimizer (and scheduler) state as bytes, when asked for.
        worker: the reporting rank (asynchronous jobs get one report per worker).
        strategy_metrics: the worker's communication figures (``Strategy.metrics()``).
        wall_start, wall_end: when the worker started and ended (``time.time()``).
        memory: per worker, ``worker``, ``peak_rss_bytes`` (the process's peak resident set) and
            ``model_state_bytes`` (the peak of its parameters + gradients + optimizer state,
            local shards only; ``train.memory``).
    """

    state: bytes
    history: list[dict[str, float]]
    train_time_s: float
    samples: int
    strategy_options: dict[str, Any] = field(default_factory=dict)
    strategy_state: dict[str, Any] = field(default_factory=dict)
    data_counters: dict[str, int] = field(default_factory=dict)
    optimizer_state: bytes = b""
    worker: int = 0
    strategy_metrics: dict[str, Any] = field(default_factory=dict)
    wall_start: float = 0.0
    wall_end: float = 0.0
    memory: list[dict[str, int]] = field(default_factory=list)

    @staticmethod
    def joined(reports: Sequence[WorkerReport | None]) -> WorkerReport:
        """Rank 0's report holding the whole model, from a stage's reports in rank order: where
        other ranks returned their shares of the state (a sharding strategy's shards), they are
        joined here, on the driver, which has the memory the ranks lack.

        Raises:
            WorkerFailed: rank 0 returned no report (a result other than sparkdp's).
        """
        first = reports[0] if reports else None
        if first is None:
            raise WorkerFailed(
                "rank 0 returned no report; its task's result is not sparkdp's training report."
            )
        shares = [r.state for r in reports if r is not None]
        if len(shares) == 1:
            return first
        return replace(first, state=state_to_bytes(join_parts(shares)))

    def summary_json(self) -> str:
        """Everything but the two byte fields, as JSON (the DataFrame path's ``info`` column)."""
        return json.dumps({k: v for k, v in asdict(self).items() if k not in _BYTES})

    @classmethod
    def from_parts(cls, summary_json: str, state: bytes, optimizer_state: bytes = b"") -> WorkerReport:
        """The inverse of :meth:`summary_json` plus the byte fields."""
        return cls(state=bytes(state), optimizer_state=bytes(optimizer_state), **json.loads(summary_json))

    def then(self, later: WorkerReport) -> WorkerReport:
        """This stage's report followed by the next stage's (per-epoch DataFrame stages)."""
        mine, theirs = self.data_counters, later.data_counters  # summed key by key, zero counts kept
        counters = {key: mine.get(key, 0) + theirs.get(key, 0) for key in {**mine, **theirs}}
        return replace(
            later,
            history=self.history + later.history,
            train_time_s=self.train_time_s + later.train_time_s,
            samples=self.samples + later.samples,
            data_counters=counters,
            wall_start=self.wall_start,
            memory=_peak_memory(self.memory, later.memory),
        )


def _peak_memory(earlier: list[dict[str, int]], later: list[dict[str, int]]) -> list[dict[str, int]]:
    """Per worker, the larger of two stages' peaks (a streamed job's stages each measure their own)."""
    peaks = {m["worker"]: dict(m) for m in earlier}
    for m in later:
        mine = peaks.setdefault(m["worker"], {})
        for key, value in m.items():
            mine[key] = value if key == "worker" else max(value, mine.get(key, value))
    return [peaks[w] for w in sorted(peaks)]
