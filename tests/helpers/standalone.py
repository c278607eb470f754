"""A real Spark standalone cluster on 127.0.0.1 for tests: one Master and N Workers, each its own
process group (a Worker and the executor it launches die together when the group is killed)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StandaloneCluster:
    directory: Path
    workers: int = 2
    cores: int = 1
    #: Java options of the Workers (SPARK_WORKER_OPTS), e.g. -Dspark.decommission.enabled=true
    worker_opts: str = ""
    master_url: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_WORKER_DIR": str(self.directory / "work"),
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            **({"SPARK_WORKER_OPTS": self.worker_opts} if self.worker_opts else {}),
        }

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        port = _free_port()
        self.master_url = f"spark://127.0.0.1:{port}"
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            "0",
        )
        for i in range(self.workers):
            self._start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                str(self.cores),
                "--memory",
                "2g",
                "--webui-port",
                "0",
                self.master_url,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = (self.directory / "master.log").read_text(errors="replace")
            if text.count("Registering worker") >= self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"the standalone cluster did not come up in {timeout_s} s; see {self.directory}")

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and everything it started (its executor and Python workers)."""
        os.killpg(self.procs[1 + i].pid, signal.SIGKILL)

    def worker_processes(self, i: int) -> list[psutil.Process]:
        """Everything worker ``i`` started: its executors, their Python daemons and workers (which
        PySpark's daemon moves into a process group of its own)."""
        try:
            return psutil.Process(self.procs[1 + i].pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def decommission_worker(self, i: int) -> None:
        """SIGPWR to worker ``i``: with spark.decommission.enabled on the Worker, it decommissions
        itself and its executors (they take no new tasks)."""
        os.kill(self.procs[1 + i].pid, signal.SIGPWR)

    def stop(self) -> None:
        started = [p for i in range(len(self.procs) - 1) for p in self.worker_processes(i)]
        for p in started:  # the Python daemons and workers are outside the Workers' groups
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)
