"""A worker killed under the Python API: sparkdp's one-line error, without the JVM's stack
traces of the failed tasks on the console (the command line's quiet default, for sessions
sparkdp starts through the API too)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest

session_module = importlib.import_module("sparkdp.spark.session")  # (the package's `session` is the function)

KILLED = textwrap.dedent(
    """
    import torch, sparkdp
    x, y = torch.randn(512, 4), torch.randint(0, 2, (512,))
    try:
        sparkdp.fit(torch.nn.Linear(4, 2), (x, y), workers=2, epochs=1, batch_size=8,
                    max_restarts=0, show_progress=False)
    except sparkdp.errors.WorkerFailed as exc:
        print("sparkdp said:", str(exc).splitlines()[0])
    """
)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_killed_worker_prints_no_java_stack_trace_through_the_api(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", KILLED],
        capture_output=True,
        text=True,
        timeout=220,
        cwd=tmp_path,
        env={**os.environ, "SPARKDP_FAULT": "kill:rank=1:step=3"},
    )
    assert "sparkdp said: worker" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
    assert "ERROR Executor" not in proc.stderr and "\tat org.apache.spark" not in proc.stderr, proc.stderr[
        -3000:
    ]


class _Recorder:
    """A stand-in for py4j's JVM view: records the loggers whose level is set."""

    def __init__(self) -> None:
        self.set: list[tuple[str, str]] = []
        self.org = self
        self.apache = self
        self.logging = self
        self.log4j = self
        self.core = self
        self.config = self
        self.Level = self
        self.Configurator = self

    def toLevel(self, name: str) -> str:  # noqa: N802 - log4j's spelling
        return name

    def setLevel(self, logger: str, level: str) -> None:  # noqa: N802
        self.set.append((logger, level))


@pytest.mark.timeout(10)
def test_asking_for_warnings_shows_the_task_failures_again():
    jvm = _Recorder()
    sc = type("SC", (), {"_jvm": jvm})()
    session_module._show_task_failures(sc, "ERROR")
    session_module._show_task_failures(sc, "OFF")
    assert jvm.set == []
    session_module._show_task_failures(sc, "warn")
    assert jvm.set == [
        ("org.apache.spark.executor.Executor", "WARN"),
        ("org.apache.spark.scheduler.TaskSetManager", "WARN"),
    ]
