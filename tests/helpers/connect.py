"""A Spark Connect server for tests: a local[N] Spark with Spark's Connect plugin (what
start-connect-server.sh and ``spark.api.mode=connect`` start) in a process of its own, so that the
test process can hold a classic session and a Connect client to this server at once (PySpark's
in-process local server needs the process's only SparkContext, and always listens on port 15002)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SERVER = """
import sys
import sparkdp
spark = sparkdp.session(sys.argv[1], app_name="sparkdp-connect-tests",
                        conf={"spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
                              "spark.connect.grpc.binding.port": sys.argv[2],
                              "spark.connect.grpc.binding.address": "127.0.0.1"})
spark.range(1).collect()
print("ready", flush=True)
sys.stdin.read()  # serve until the test closes the pipe
spark.stop()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectServer:
    """``with ConnectServer("local[2,4]") as url:`` the ``sc://`` URL to connect to."""

    def __init__(self, master: str = "local[2,4]", start_timeout_s: float = 120.0) -> None:
        self.master, self.start_timeout_s = master, start_timeout_s
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        # Absolute entries: the server's Python workers run in a per-session folder, where a
        # relative PYTHONPATH would find nothing (or another checkout's editable install).
        path = [
            str(ROOT / "src"),
            str(ROOT),
            *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, self.master, str(self.port)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.__exit__()
            raise RuntimeError(f"the Spark Connect test server did not start (exit {self.proc.returncode})")
        return self.url

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
