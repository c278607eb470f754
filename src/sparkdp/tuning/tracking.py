"""A search in MLflow: one parent run for the study, one child run per trial.

Trials run at once in threads, and MLflow's fluent API (``mlflow.start_run``) keeps its active
run per thread, so nothing here uses it: every call goes through MLflow's client with the run's
id, and each trial's job is handed its own child run's id (the ``mlflow_run_id`` setting), which
its monitoring sink logs the epochs into. Concurrent trials therefore never write into each
other's runs. Parameters, tags and errors pass through :func:`sparkdp.redact.redact` first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any

from ..config import JobConfig
from ..monitor.sinks import log_params, mlflow_client
from ..redact import redact

log = logging.getLogger(__name__)

#: MLflow's tag that makes a run another's child (what its UI nests runs by)
PARENT_TAG = "mlflow.parentRunId"
#: a trial's end as its child run's status: a pruned trial was stopped early, on purpose
RUN_STATUS = {"complete": "FINISHED", "pruned": "KILLED", "failed": "FAILED"}
#: MLflow keeps tag values up to 8000 characters; an error's text is cut well before
TAG_CHARS = 2000


class NoTracking:
    """No MLflow configured: trials' jobs run as they are and nothing is logged."""

    def job_for(self, job: JobConfig, number: int, params: dict[str, Any]) -> JobConfig:
        return job

    def trial_ended(self, record: Any) -> None:
        pass


class StudyTracking:
    """The study's parent run, opened on creation, and its trials' child runs.

    Args:
        tracking_uri: the MLflow tracking URI (the job's ``mlflow`` setting).
        study_name: the parent run's name.
        params: the search's definition (space, sampler, pruner, metric, direction, seed, trials),
            logged as the parent run's parameters.
    """

    def __init__(self, tracking_uri: str, study_name: str, params: dict[str, Any]) -> None:
        self.tracking_uri = tracking_uri
        self.client, self.experiment_id = mlflow_client(tracking_uri)
        tags = {"study_name": study_name}
        self.run_id: str = self.client.create_run(
            self.experiment_id, run_name=study_name, tags=tags
        ).info.run_id
        log_params(self.client, self.run_id, {k: v for k, v in params.items() if v is not None})
        self._children: dict[int, str] = {}
        self._lock = threading.Lock()

    def _child(self, number: int, params: dict[str, Any]) -> str:
        """Trial ``number``'s run, created (with its sampled ``params``) the first time it is asked for."""
        with self._lock:
            if number in self._children:
                return self._children[number]
        tags = {PARENT_TAG: self.run_id, "trial_number": str(number), "trial_state": "running"}
        run_id: str = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number}", tags=tags
        ).info.run_id
        log_params(self.client, run_id, params)
        with self._lock:
            self._children[number] = run_id
        return run_id

    def job_for(self, job: JobConfig, number: int, params: dict[str, Any]) -> JobConfig:
        """Trial ``number``'s job, logging into its own child run."""
        monitor = dataclasses.replace(
            job.monitor, mlflow=self.tracking_uri, mlflow_run_id=self._child(number, params)
        )
        return dataclasses.replace(job, monitor=monitor)

    def trial_ended(self, record: Any) -> None:
        """The trial's final state (``trial_state`` tag, the run's status) and error, if any."""
        run_id = self._child(record.number, record.params)  # (a trial that failed before its job started)
        tags = {"trial_state": record.state}
        if record.error:
            tags["trial_error"] = str(redact(record.error))[:TAG_CHARS]
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)
        if record.state == "complete" and record.value is not None:  # the value the study was told
            self.client.log_metric(run_id, "objective", float(record.value))
        self.client.set_terminated(run_id, RUN_STATUS.get(record.state, "FAILED"))
        with self._lock:
            del self._children[record.number]

    def finish(self, result: dict[str, Any], json_out: str | None) -> None:
        """The study's outcome on the parent run: best value, trial, params; counts by state; the
        parameters' Optuna distributions; the ``--json-out`` file as an artifact."""
        client, run_id = self.client, self.run_id
        states = [t["state"] for t in result["trials"]]
        for state in ("complete", "pruned", "failed"):
            client.log_metric(run_id, f"trials_{state}", states.count(state))
        distributions = {f"distribution.{k}": v for k, v in result.get("distributions", {}).items()}
        best = result["best"]
        if best is not None:
            client.log_metric(run_id, "best_value", float(best["value"]))
            client.set_tag(run_id, "best_trial", str(best["number"]))
            client.set_tag(run_id, "best_params", json.dumps(redact(best["params"]), default=str)[:TAG_CHARS])
        log_params(
            client,
            run_id,
            {**distributions, **({f"best.{k}": v for k, v in best["params"].items()} if best else {})},
        )
        if json_out:
            try:
                client.log_artifact(run_id, json_out)
            except Exception as exc:  # noqa: BLE001 - the artifact store is MLflow's; the study is done
                log.warning("sparkdp: cannot store %s in MLflow's artifacts: %s", json_out, redact(str(exc)))

    def close(self, status: str) -> None:
        """End the parent run, and any trial run an interruption left open, with ``status``."""
        with self._lock:
            left = list(self._children.values())
            self._children.clear()
        for run_id in left:
            self.client.set_terminated(run_id, "KILLED")
        self.client.set_terminated(self.run_id, status)


__all__ = ["NoTracking", "StudyTracking"]
