"""``sparkdp report`` for a search: Optuna's optimisation history and parameter importances,
drawn from a ``sparkdp tune --json-out`` file.

The file holds every trial's parameters, state, value and intermediate values, and each
parameter's Optuna distribution as Optuna's own JSON (``distribution_to_json``), read back with
``json_to_distribution``: nothing in it is evaluated. The trials are added to an in-memory
study, which Optuna's matplotlib plots draw.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import DataError

_STATES = {"complete": "COMPLETE", "pruned": "PRUNED", "failed": "FAIL"}


def is_search_summary(path: str) -> bool:
    """Whether ``path`` is a file (a ``sparkdp tune --json-out``), not a run's directory."""
    return Path(path).is_file()


def load_study(path: str) -> Any:
    """An in-memory Optuna study holding the finished trials of a ``sparkdp tune`` summary."""
    import optuna
    from optuna.distributions import json_to_distribution
    from optuna.trial import TrialState, create_trial

    try:
        summary = json.loads(Path(path).read_text())
        dists = {k: json_to_distribution(v) for k, v in summary["distributions"].items()}
        direction, trials = summary["direction"], summary["trials"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(
            f"{path} is not a sparkdp tune summary ({type(exc).__name__}: {exc}); give the file "
            "sparkdp tune --json-out wrote, or a run's directory."
        ) from None
    study = optuna.create_study(direction=direction)
    for t in trials:
        if t.get("state") not in _STATES:
            continue  # a trial still running when the summary was written
        state = TrialState[_STATES[t["state"]]]
        study.add_trial(
            create_trial(
                params=t["params"],
                distributions={k: dists[k] for k in t["params"]},
                value=t["value"] if state == TrialState.COMPLETE else None,
                intermediate_values={int(k): v for k, v in t.get("intermediate", {}).items()},
                state=state,
            )
        )
    return study


def write_search_report(path: str, out: str) -> list[Path]:
    """``optimization_history.png`` and, with 2 or more complete trials, ``param_importances.png``
    in ``out``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as plots
    from optuna.trial import TrialState

    study = load_study(path)
    Path(out).mkdir(parents=True, exist_ok=True)
    drawn: list[tuple[str, Callable[[Any], Any]]] = [
        ("optimization_history.png", plots.plot_optimization_history)
    ]
    if len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) >= 2:
        drawn.append(("param_importances.png", plots.plot_param_importances))
    written = []
    for name, plot in drawn:
        figure = plot(study).get_figure(root=True)  # Optuna draws on an Axes of a new figure
        target = Path(out) / name
        figure.savefig(target, dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(target)
    return written


__all__ = ["is_search_summary", "load_study", "write_search_report"]
