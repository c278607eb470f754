"""What a worker is given to train (:class:`FitSpec`, :class:`StagePart`) and the one entry every
worker of ``fit`` runs (:func:`fit_worker`; world size 1 runs it locally).

The training itself is :class:`~sparkdp.train.trainer.Trainer`'s, with its collaborators: the
saver (``train.saver``), the preemption watch (``train.preempt``), the evaluator
(``train.evaluator``) and the worker's role (``train.role``). The names other code imports
from here stay importable here.
"""

from __future__ import annotations

from ..comm.base import Collective, is_collective_timeout
from ..errors import WorkerHung
from ..monitor.probe import open_probe
from .batch_check import check_batch, check_labels, class_scores
from .evaluator import evaluate, metric_names
from .optim import optimizer_state, optimizer_state_to_bytes
from .preempt import watch_preemption
from .report import WorkerReport
from .role import role_of
from .spec import FitSpec, StagePart
from .trainer import Trainer, synchronized


def fit_worker(spec: FitSpec, collective: Collective) -> WorkerReport | None:
    """The training every worker runs (:class:`~sparkdp.train.trainer.Trainer`), with a hang
    named: when a collective times out, the ranks that did not time out too are the stalled ones."""
    probe = open_probe(spec.monitor, collective.rank, spec.strategy.comm_stats)
    try:
        with watch_preemption(collective, spec.checkpoint) as watch:
            return Trainer(spec, collective, probe, watch).fit()
    except RuntimeError as exc:
        if not role_of(collective).names_stalled_peers or not is_collective_timeout(exc):
            raise
        raise WorkerHung(_who_stalled(collective)) from exc
    finally:
        probe.close()


def _who_stalled(collective: Collective) -> str:
    me, stalled = collective.rank, collective.stalled_ranks()
    who = f"worker {', '.join(map(str, stalled))}" if stalled else "another worker"
    return f"{who} stopped making progress; worker {me} timed out waiting for it in a collective"


__all__ = [
    "FitSpec",
    "StagePart",
    "check_batch",
    "check_labels",
    "class_scores",
    "evaluate",
    "fit_worker",
    "metric_names",
    "optimizer_state",
    "optimizer_state_to_bytes",
    "synchronized",
]
