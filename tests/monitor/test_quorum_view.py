"""What a per-step fault-tolerant job shows without its workers' metrics: the progress line's
quorum size from the driver's quorum, and ``sparkdp report``'s throughput with each leave and
join marked (run logs written by hand here; the driver's side is ``tests/driver/test_quorum_progress.py``)."""

from __future__ import annotations

import io
import json

import pytest

from sparkdp.monitor.display import Display
from sparkdp.monitor.report import load_run, pyplot, throughput_figure, write_report
from sparkdp.train.row_cursor import RowCursor

pytestmark = pytest.mark.timeout(60)


def _progress(steps: int, quorum: int, samples_per_s: float | None = None) -> dict:
    return {
        "steps": steps,
        "samples_per_s": samples_per_s,
        "quorum": quorum,
        "workers": 2,
        "total_steps": 40,
        "steps_per_epoch": 20,
        "epochs": 2,
    }


def test_the_progress_line_shows_the_quorum_size_and_where_its_steps_are() -> None:
    out = io.StringIO()  # not a terminal: progress lines, the first at once
    display = Display("job", 2, stream=out, line_every_s=1e9)
    display.quorum(_progress(0, 2))  # while Spark starts the tasks: not where the ETA's pace starts
    assert display.first_seen is None
    display.line_every_s = 0.0
    display.quorum(_progress(10, 2))
    assert display.first_seen is not None and display.first_seen[1] == 0.25
    display.quorum(_progress(30, 1, samples_per_s=320.0))
    display.quorum(_progress(40, 2))
    lines = out.getvalue().splitlines()
    # 10 of 20 steps an epoch: epoch 1 step 10, 25 % of 40; 30 steps: epoch 2 step 10, 75 %
    assert lines[0].startswith("job: epoch 1/2 step 10/20 (25%), quorum 2/2, ETA")
    assert lines[1].startswith("job: epoch 2/2 step 10/20 (75%), 320 samples/s, quorum 1/2, ETA")
    assert lines[2].startswith("job: epoch 2/2 step 20/20 (100%), quorum 2/2")  # the last step ends epoch 2


def test_a_job_whose_workers_report_shows_no_quorum() -> None:
    display = Display("job", 1, enabled=False)
    display.update({0: {"epoch": 1, "step": 3, "samples_per_s": 10.0}}, {})
    assert "quorum" not in display.headline() and "10 samples/s" in display.headline()


def test_rows_before_a_step_count_each_epochs_rows_once() -> None:
    cursor = RowCursor(rows=10, global_batch=4, epochs=2, shuffle=False)  # steps of 4, 4, 2 rows
    assert [cursor.rows_before(s) for s in range(7)] == [0, 4, 8, 10, 14, 18, 20]
    assert [cursor.rows_before(s) for s in range(7)] == [
        sum(len(cursor.step_rows(k)) for k in range(s)) for s in range(7)
    ]


def _run_log(run_dir, records: list[dict]) -> None:
    run_dir.mkdir()
    header = {"type": "header", "time": 1000.0, "config": {"strategy": "allreduce", "workers": 2}}
    (run_dir / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [header, *records]))


_LEAVE = {"worker": 1, "step": 12, "kind": "leave", "cause": "its connection closed", "time": 1003.5}
_JOIN = {
    "worker": 1,
    "step": 20,
    "kind": "join",
    "healed_from": 0,
    "heal_s": 0.1,
    "bytes": 10,
    "time": 1006.0,
}
_JOBS = [
    {"type": "job", "time": 1000.0 + t, "samples_per_s": rate, "quorum": q}
    for t, rate, q in ((2, 200.0, 2), (4, 90.0, 1), (6, 100.0, 1), (8, 210.0, 2))
]


def _marks(ax) -> list[tuple[float, str]]:
    return [(line.get_xdata()[0], line.get_linestyle()) for line in ax.lines[1:]]


def test_report_marks_each_leave_and_join_on_the_throughput_where_the_run_log_has_them(tmp_path) -> None:
    _run_log(tmp_path / "step", [*_JOBS, {**_LEAVE, "type": "membership"}, {**_JOIN, "type": "membership"}])
    fig = throughput_figure([load_run(tmp_path / "step")])
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == [200.0, 90.0, 100.0, 210.0]
    assert list(ax.lines[0].get_xdata()) == [2.0, 4.0, 6.0, 8.0]  # seconds since the header
    assert _marks(ax) == [(3.5, "--"), (6.0, ":")]  # the leave dashed, the join dotted
    assert all(line.get_color() == ax.lines[0].get_color() for line in ax.lines[1:])
    pyplot().close(fig)
    files = write_report([load_run(tmp_path / "step")], tmp_path / "report")
    assert (tmp_path / "report" / "throughput.png") in files
    assert (tmp_path / "report" / "throughput.png").stat().st_size > 10_000


def test_a_run_log_with_the_leaves_and_joins_only_in_its_summary_is_marked_from_there(tmp_path) -> None:
    _run_log(tmp_path / "step", [*_JOBS, {"type": "summary", "time": 1009.0, "membership": [_LEAVE, _JOIN]}])
    _run_log(tmp_path / "restart", _JOBS)  # no membership: no marks
    fig = throughput_figure([load_run(tmp_path / "step"), load_run(tmp_path / "restart")])
    ax = fig.axes[0]
    marks = [line for line in ax.lines if len(set(line.get_xdata())) == 1]
    assert [(line.get_xdata()[0], line.get_linestyle()) for line in marks] == [(3.5, "--"), (6.0, ":")]
    assert len(ax.lines) == 4  # two throughput lines, two marks
    pyplot().close(fig)
