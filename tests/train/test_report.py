"""WorkerReport: the typed record rank 0 returns, through the DataFrame path's Arrow columns."""

from sparkdp.train.report import WorkerReport


def _report(epoch: int, samples: int, dropped: int) -> WorkerReport:
    return WorkerReport(
        state=b"s%d" % epoch,
        history=[{"epoch": epoch, "loss": 1.0 / epoch}],
        train_time_s=2.0,
        samples=samples,
        strategy_options={"period": 5},
        strategy_state={"steps": 10 * epoch},
        data_counters={"dropped_null_rows": dropped},
        optimizer_state=b"o%d" % epoch,
    )


def test_summary_json_and_the_byte_fields_rebuild_the_report():
    report = _report(1, 600, 2)
    assert WorkerReport.from_parts(report.summary_json(), report.state, report.optimizer_state) == report
    assert "s1" not in report.summary_json()  # the bytes travel in their own columns


def test_then_concatenates_histories_and_sums_what_adds_up():
    merged = _report(1, 600, 2).then(_report(2, 590, 3))
    assert merged.history == [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.5}]
    assert (merged.samples, merged.train_time_s, merged.data_counters) == (
        1190,
        4.0,
        {"dropped_null_rows": 5},
    )
    assert (merged.state, merged.optimizer_state, merged.strategy_state) == (b"s2", b"o2", {"steps": 20})


def test_then_keeps_each_workers_peak_memory_over_the_stages():
    from dataclasses import replace

    first = replace(
        _report(1, 600, 2),
        memory=[
            {"worker": 0, "peak_rss_bytes": 900, "model_state_bytes": 50},
            {"worker": 1, "peak_rss_bytes": 700, "model_state_bytes": 50},
        ],
    )
    second = replace(
        _report(2, 590, 3),
        memory=[
            {"worker": 0, "peak_rss_bytes": 800, "model_state_bytes": 60},
            {"worker": 1, "peak_rss_bytes": 950, "model_state_bytes": 40},
        ],
    )
    assert first.then(second).memory == [
        {"worker": 0, "peak_rss_bytes": 900, "model_state_bytes": 60},
        {"worker": 1, "peak_rss_bytes": 950, "model_state_bytes": 50},
    ]
