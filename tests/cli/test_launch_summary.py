"""`sparkdp launch --out DIR --json-out FILE`: the run log and the summary of a launched script,
with the parameter server's totals even for a job shorter than one progress interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import Cli
from .test_cli import _explain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BATCHES = 38  # tests/scripts/hogwild.py's batches per epoch on each of 2 workers (1,216 rows / 32)


def _hogwild(tmp: Path) -> Cli:
    argv = [
        "launch",
        "--workers",
        "2",
        "--master",
        "local[2]",
        "--strategy",
        "hogwild",
        "--metrics-interval",
        "600",  # longer than the job: the totals must not come from a progress report
        "--out",
        tmp / "run",
        "--json-out",
        tmp / "summary.json",
        SCRIPTS / "hogwild.py",
        "--",
        "--num-processes",
        "1",
        "--epochs",
        "1",
        "--out",
        tmp / "accuracy.json",
    ]
    return Cli(argv, master="local[2]")


@pytest.mark.cli(build=_hogwild)
def test_a_short_hogwild_launch_reports_the_servers_totals_in_its_summary_and_run_log(cli):
    (proc,) = cli.procs
    assert proc.returncode == 0, _explain(proc)
    summary = json.loads((cli.tmp / "summary.json").read_text())
    # hogwild pushes after every optimizer step: one push per batch of each worker
    assert summary["server"]["pushes_applied"] == 2 * BATCHES, summary
    assert (summary["strategy"], summary["workers"]) == ("hogwild", 2)
    assert summary["script"] == str(SCRIPTS / "hogwild.py")
    records = [json.loads(line) for line in (cli.tmp / "run" / "run.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["type"] == "summary"]
    assert logged["server"]["pushes_applied"] == 2 * BATCHES
    assert f"parameter server: {2 * BATCHES:,} pushes" in proc.stdout + proc.stderr, _explain(proc)
