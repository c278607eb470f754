"""Command lines that need no process of their own run in one interpreter (tests/cli/run_cli.py).

A test marked ``@pytest.mark.cli(build=build)`` takes the fixture ``cli``: ``build(tmp, **params)``
(``tmp``: an empty directory of the test's own; ``params``: the test's parametrize arguments)
returns the :class:`Cli` command lines the test asserts on, and ``cli`` gives them back, run, as
``subprocess.CompletedProcess``es. Every selected test's command lines run, in the first such
test's set-up, in one subprocess: one Python, torch and JVM start for all of them instead of one
per command (several seconds each). A test that kills, signals or times a process, or that needs
a cluster or an environment of its own, still starts ``sparkdp`` itself (tests/cli/test_cli.py),
or does so in its build step when a command line of the runner follows (tests/cli/test_resume.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("run_cli.py")
# the set-up of the first marked test runs every marked test's command lines (each is bounded by
# its own Cli.timeout in the runner)
CLI_RUNS_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Cli:
    """One ``sparkdp`` command line.

    Attributes:
        argv: its arguments (after ``sparkdp``).
        master: the Spark master it trains on ("" for sparkdp's default), or None when it must
            stop before starting Spark (bad input): the runner holds a session on that master
            before it runs, as a notebook would, and runs the None ones first, before any exists.
        env: variables set while it runs (the driver's; not the executors').
        spark_env: variables the executors must see: the runner process starts with them.
        cwd: its working directory.
        timeout: seconds it may take.
    """

    argv: Sequence[str]
    master: str | None = ""
    env: Mapping[str, str] = field(default_factory=dict)
    spark_env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | str | None = None
    timeout: float = 240


@dataclass(frozen=True)
class CliRuns:
    tmp: Path  # the directory build() was given
    procs: list[subprocess.CompletedProcess]


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("cli"):
            item.add_marker(pytest.mark.timeout(CLI_RUNS_TIMEOUT_S), append=False)


def _explain_runner(proc: subprocess.CompletedProcess) -> str:
    return f"the runner exited {proc.returncode}\nits stderr:\n{proc.stderr[-5000:]}"


@pytest.fixture(scope="session")
def cli_runs(
    request, tmp_path_factory
) -> tuple[dict[str, CliRuns], dict[str, BaseException], subprocess.CompletedProcess]:
    """Every selected marked test's command lines, run in one interpreter: nodeid -> its runs;
    nodeid -> what its build raised; the runner's own process."""
    wanted: dict[str, tuple[Path, list[Cli]]] = {}
    unbuilt: dict[str, BaseException] = {}  # a build that skipped (an input missing here) or failed
    for item in request.session.items:
        if (marker := item.get_closest_marker("cli")) is None:
            continue
        if any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
            continue  # (e.g. needs_fashion without the dataset) the test skips before it asks
        tmp = tmp_path_factory.mktemp(re.sub(r"\W+", "_", item.name)[:40])
        try:
            built = marker.kwargs["build"](tmp, **getattr(getattr(item, "callspec", None), "params", {}))
        except (Exception, pytest.skip.Exception) as exc:
            unbuilt[item.nodeid] = exc
            continue
        wanted[item.nodeid] = (tmp, [built] if isinstance(built, Cli) else list(built))
    jobs, spark_env = [], {}
    for nodeid, (_, clis) in wanted.items():
        for i, cli in enumerate(clis):
            for name, value in cli.spark_env.items():
                assert spark_env.setdefault(name, value) == value, f"two values for the executors' {name}"
            jobs.append(
                {
                    "key": f"{nodeid}#{i}",
                    "argv": [str(a) for a in cli.argv],
                    "master": cli.master,
                    "env": dict(cli.env),
                    "cwd": None if cli.cwd is None else str(cli.cwd),
                    "timeout": cli.timeout,
                }
            )
    work = tmp_path_factory.mktemp("cli-runner")
    (work / "jobs.json").write_text(json.dumps(jobs))
    runner = subprocess.run(
        [sys.executable, str(RUNNER), str(work / "jobs.json"), str(work / "results.jsonl")],
        capture_output=True,
        text=True,
        env={**os.environ, **spark_env},
        cwd=work,
        timeout=60 + sum(job["timeout"] for job in jobs),
    )
    results = {}
    if (work / "results.jsonl").is_file():
        for line in (work / "results.jsonl").read_text().splitlines():
            run = json.loads(line)
            results[run["key"]] = run
    runs = {}
    for nodeid, (tmp, clis) in wanted.items():
        keys = [f"{nodeid}#{i}" for i in range(len(clis))]
        if all(key in results for key in keys):
            procs = [
                subprocess.CompletedProcess(
                    ["sparkdp", *map(str, cli.argv)],
                    results[key]["returncode"],
                    results[key]["stdout"],
                    results[key]["stderr"],
                )
                for cli, key in zip(clis, keys)
            ]
            runs[nodeid] = CliRuns(tmp, procs)
    return runs, unbuilt, runner


@pytest.fixture
def cli(request, cli_runs) -> CliRuns:
    runs, unbuilt, runner = cli_runs
    if request.node.get_closest_marker("cli") is None:
        raise pytest.UsageError("the fixture cli needs @pytest.mark.cli(build=...)")
    if (exc := unbuilt.get(request.node.nodeid)) is not None:
        raise exc
    if request.node.nodeid not in runs:
        pytest.fail(f"the command lines of {request.node.name} did not finish\n{_explain_runner(runner)}")
    return runs[request.node.nodeid]
