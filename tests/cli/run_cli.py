"""Run several ``sparkdp`` command lines one after another in this one interpreter, the way a
notebook user calls ``sparkdp.cli.main.main`` several times: Python, torch and the JVM start once
for all of them instead of once per command (tests/cli/conftest.py, fixture ``cli_runs``).

    python tests/cli/run_cli.py JOBS.json RESULTS.jsonl

JOBS.json: a list of ``{"key": ..., "argv": [...], "cwd": ..., "env": {...}, "master": ..., "timeout": 240}``.

Each job runs with its ``env`` set and its ``cwd`` as working directory (both undone after it).
``master``: the Spark master of a session started for the job before the command line runs, as a
notebook holds one ("" for sparkdp's default master); the command line finds it running and keeps
it for the next job (a different master stops it first; the JVM stays). ``null``: the job starts
no session of its own (bad input refused before Spark starts); the runner runs those jobs first,
before any session exists. A variable Spark's executors must see belongs in this process's own
environment: executors inherit the JVM's, which starts with the first session.

After each job, one line of RESULTS.jsonl (a file, not stdout, which the JVM and its executors
share) with its key, exit status (``main``'s return value,
or that of ``sys.exit``; 1 and the traceback for an exception) and what it printed on
``sys.stdout`` and ``sys.stderr``, and its wall time (``wall_s``). A job still running after its ``timeout`` seconds ends this
process with every thread's traceback on stderr (faulthandler)."""

import contextlib
import faulthandler
import io
import json
import logging
import os
import sys
import time
import traceback


def _hold_session(master: str) -> None:
    """An active session on ``master`` ("" for the default), started as the command line would
    start it (Spark's console log off), stopping one on another master first."""
    from pyspark.sql import SparkSession

    import sparkdp
    from sparkdp.spark.cluster import master_of
    from sparkdp.spark.session import default_master

    active = SparkSession.getActiveSession()
    if active is not None and master_of(active) != (master or default_master()):
        active.stop()
    sparkdp.session(master or None, log_level="OFF")


def run_one(job: dict) -> dict:
    from sparkdp.cli.main import main

    if job.get("master") is not None:
        _hold_session(job["master"])
    before, cwd = dict(os.environ), os.getcwd()
    os.environ.update(job.get("env") or {})
    if job.get("cwd"):
        os.chdir(job["cwd"])
    # a fresh command line's logging: main's basicConfig writes to this job's stderr, at its -v level
    for handler in logging.root.handlers[:]:
        logging.root.removeHandler(handler)
    out, err = io.StringIO(), io.StringIO()
    status: int | str = 0
    started = time.perf_counter()
    faulthandler.dump_traceback_later(job.get("timeout", 240), exit=True)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(job["argv"])
            except SystemExit as exc:  # argparse's usage errors; None is 0, a message is 1
                status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported as the interpreter would report it
                status = 1
                traceback.print_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        for handler in logging.root.handlers[:]:
            logging.root.removeHandler(handler)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(before)
    return {
        "key": job["key"],
        "returncode": status,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    # the jobs that start no session first, while none exists; then by master, so that each
    # master's session starts once (a stable sort keeps the given order within each)
    jobs.sort(key=lambda job: (job.get("master") is not None, job.get("master") or ""))
    with open(sys.argv[2], "w") as results:
        for job in jobs:
            results.write(json.dumps(run_one(job)) + "\n")
            results.flush()


if __name__ == "__main__":
    main()
