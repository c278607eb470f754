"""Where monitoring records go: a JSON-lines run log (always), TensorBoard and MLflow (asked for).

Every sink takes the records the hub receives (``metrics``, ``epoch``, ``warning``, ``summary``;
see ``sparkdp.monitor.hub``) through :meth:`write` and is closed once at the end of the job.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..redact import redact

log = logging.getLogger(__name__)

RUN_LOG = "run.jsonl"


def versions() -> dict[str, str]:
    """The versions a run log's header records."""
    from importlib.metadata import version

    import pyspark
    import torch

    return {
        "sparkdp": version("sparkdp"),
        "torch": torch.__version__,
        "pyspark": pyspark.__version__,
        "python": platform.python_version(),
    }


def writable_dir(path: str | os.PathLike[str], what: str) -> Path:
    """Create ``path`` and check a file can be written there (at the start of a job, not its end)."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".sparkdp-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"cannot write the {what} to {str(directory)!r}: {exc.strerror or exc}. Give a "
            "directory you can write to."
        ) from None
    return directory


#: the mode of the files sparkdp writes that hold a job's settings: the owner's alone, since
#: settings hold paths, hosts and option names a shared machine's other users need not read
PRIVATE_MODE = 0o600


def open_private(path: Path) -> Any:
    """``path`` opened to append text, created :data:`PRIVATE_MODE`; an existing file others
    could read is made private first (a run log a job appends to after a restart)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, PRIVATE_MODE)
    except OSError as exc:  # a filesystem without modes (some object-store mounts): say so, go on
        log.warning("sparkdp: cannot make %s private (%s); it is readable as it was", path, exc)
    return os.fdopen(fd, "a", encoding="utf-8")


class RunLog:
    """``run.jsonl``: a header (the job's configuration and versions), then one line per record.

    Each line is flushed as it is written, so a job that crashes leaves a log that
    ``sparkdp report`` can still draw up to the crash."""

    def __init__(self, run_dir: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = writable_dir(run_dir, "run log") / RUN_LOG
        self._file = open_private(self.path)
        self.write({"type": "header", "time": time.time(), "versions": versions(), **header})

    def write(self, record: dict[str, Any]) -> None:
        # every record, not only the header: an error message may quote a URL with its credentials
        self._file.write(json.dumps(redact(record), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """TensorBoard event files in ``RUN_DIR/tensorboard`` (read them with ``tensorboard --logdir``)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs the tensorboard package: pip install 'sparkdp[tensorboard]'"
                " (or pip install tensorboard)."
            ) from None
        self.path = writable_dir(Path(run_dir) / "tensorboard", "TensorBoard logs")
        self._writer = SummaryWriter(str(self.path))

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "metrics" and "samples_per_s" in record:
            step, rank = int(record["steps"]), record["rank"]
            for key in ("loss", "samples_per_s", "cpu_percent", "data_frac", "compute_frac", "comm_frac"):
                if record.get(key) is not None:
                    self._writer.add_scalar(f"worker{rank}/{key}", record[key], step)
            self._writer.add_scalar(f"worker{rank}/rss_mb", record["rss_bytes"] / 2**20, step)
        elif kind == "epoch":
            for key, value in record.items():
                if key not in ("type", "rank", "time", "epoch") and isinstance(value, (int, float)):
                    self._writer.add_scalar(f"epoch/{key}", value, int(record["epoch"]))
        elif kind == "job" and record.get("samples_per_s") is not None:
            self._writer.add_scalar(
                "job/samples_per_s", record["samples_per_s"], int(record.get("elapsed_s", 0))
            )

    def close(self) -> None:
        self._writer.close()


#: the MLflow experiment sparkdp's runs go to
MLFLOW_EXPERIMENT = "sparkdp"
#: MLflow keeps a parameter's value up to this many characters; longer ones are cut
MLFLOW_PARAM_CHARS = 500


def mlflow_client(tracking_uri: str) -> tuple[Any, str]:
    """MLflow's own client for ``tracking_uri`` and the id of the ``sparkdp`` experiment (created
    when missing); a URI MLflow cannot use is a ConfigError with its credentials hidden."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigError(
            "--mlflow needs MLflow: pip install 'sparkdp[mlflow]' (or pip install mlflow-skinny)."
        ) from None
    from mlflow.exceptions import MlflowException

    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
        if experiment is not None:
            return client, experiment.experiment_id
        return client, client.create_experiment(MLFLOW_EXPERIMENT)
    except MlflowException as exc:
        raise ConfigError(
            f"MLflow cannot log to {redact(tracking_uri)!r}: {redact(exc.message)} Give a tracking URI such "
            "as sqlite:///PATH/mlflow.db or http://HOST:5000."
        ) from None


def log_params(client: Any, run_id: str, params: dict[str, Any]) -> None:
    """``params`` (credentials hidden, values as text) into the run, less the keys it already has:
    MLflow never changes a logged parameter, and the run's creator logged those first."""
    from mlflow.entities import Param

    have = client.get_run(run_id).data.params
    new = [
        Param(key, str(value)[:MLFLOW_PARAM_CHARS])
        for key, value in sorted(redact(params).items())
        if key not in have
    ]
    for start in range(0, len(new), 100):  # MLflow takes at most 100 parameters in one batch
        client.log_batch(run_id, params=new[start : start + 100])


class MlflowSink:
    """An MLflow run (experiment ``sparkdp``) through MLflow's own client, against ``tracking_uri``
    (``sqlite:///PATH/mlflow.db`` or a tracking server; MLflow 3 refuses its old ``file:`` store).

    With ``run_id`` the records go to that existing run (a search's trial run), which is left
    running at the end: its creator ends it. Otherwise the sink creates a run and ends it."""

    def __init__(
        self,
        tracking_uri: str,
        params: dict[str, Any],
        run_name: str | None = None,
        run_id: str | None = None,
    ) -> None:
        from mlflow.exceptions import MlflowException

        self.client, experiment_id = mlflow_client(tracking_uri)
        self._owned = run_id is None
        try:
            if run_id is None:
                run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            self.run_id: str = run_id
            log_params(self.client, run_id, {k: v for k, v in params.items() if k != "mlflow_run_id"})
        except MlflowException as exc:
            raise ConfigError(
                f"MLflow cannot log to {redact(tracking_uri)!r}: {redact(exc.message)} Give a tracking URI "
                "such as sqlite:///PATH/mlflow.db or http://HOST:5000 (and mlflow_run_id a run it holds)."
            ) from None
        self._status = "FINISHED"

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "epoch":
            for key, value in record.items():
                if key not in ("type", "rank", "time", "epoch") and isinstance(value, (int, float)):
                    self.client.log_metric(self.run_id, key, float(value), step=int(record["epoch"]))
        elif kind == "job" and record.get("samples_per_s") is not None:
            self.client.log_metric(
                self.run_id,
                "samples_per_s",
                float(record["samples_per_s"]),
                step=int(record.get("elapsed_s", 0)),
            )
        elif kind == "failed":
            self._status = "FAILED"

    def close(self) -> None:
        if self._owned:
            self.client.set_terminated(self.run_id, self._status)
