"""The monitoring hub and probes over the real authenticated TCP transport (no Spark)."""

from __future__ import annotations

import json
import re
import time

import pytest

from sparkdp.errors import AuthenticationError
from sparkdp.monitor.hub import MonitorHub
from sparkdp.monitor.probe import MonitorLink, Probe
from sparkdp.ps.transport.base import ConnectFailed, ConnectInfo
from sparkdp.ps.transport.tcp import TcpTransport

pytestmark = pytest.mark.timeout(60)


def _records(run_dir, kind):
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the hub never received the records"
        time.sleep(0.05)


def test_probe_records_reach_the_run_log_with_rates_from_the_counters(tmp_path):
    with MonitorHub(
        world_size=1, config={"strategy": "allreduce"}, run_dir=str(tmp_path), display=False, interval_s=0.1
    ) as hub:
        comm = {"comm_s": 0.5, "bytes_sent": 1000, "bytes_recv": 10}  # 0.5 s before the first step (a pull)
        probe = Probe(hub.link, rank=0, comm_stats=lambda: dict(comm))
        probe.start_epoch(0, 20, 1)
        time.sleep(0.3)
        for _ in range(10):  # 10 steps of 32 rows: 0.1 s waiting for data, 1.0 s in the step each
            probe.batch_arrived(0.1)
            comm["comm_s"] += 0.05  # communication inside the step
            probe.step_done(1.0, 32, 2.0)
        probe.event("epoch", epoch=1, loss=2.0)
        probe.close()
        _wait_for(lambda: hub.epochs)
        hub.finish({"strategy": "allreduce", "test_accuracy": 0.5})
    header = _records(tmp_path, "header")[0]
    assert header["config"] == {"strategy": "allreduce"} and header["versions"]["torch"]
    last = _records(tmp_path, "metrics")[-1]
    assert (last["steps"], last["samples"], last["rank"]) == (10, 320, 0)
    assert last["loss"] == pytest.approx(2.0)
    # 10 s in steps of which 0.5 s communicating, and 0.5 s communicating before them: compute 9.5 s,
    # communication 1 s, data 1 s (hand-worked; the earlier pull is no step's, so not negative compute)
    assert last["compute_s"] == pytest.approx(9.5) and last["data_s"] == pytest.approx(1.0)
    assert last["comm_s"] == pytest.approx(1.0) and last["bytes_sent"] == 1000
    assert last["data_frac"] + last["compute_frac"] + last["comm_frac"] == pytest.approx(1.0)
    assert _records(tmp_path, "epoch")[0]["loss"] == 2.0
    assert _records(tmp_path, "summary")[0]["test_accuracy"] == 0.5


def test_the_hub_trusts_the_authenticated_worker_id_not_the_record(tmp_path):
    with MonitorHub(world_size=2, config={}, run_dir=str(tmp_path), display=False) as hub:
        info = hub.link.info
        with TcpTransport().connect(info.address, info.secret, 1) as client:
            client.report({"type": "epoch", "rank": 0, "epoch": 1, "loss": 1.0, "time": time.time()})
            client.report({"type": "run_this", "code": "import os"})  # unknown kinds are dropped
            _wait_for(lambda: hub.epochs)
    assert [r["rank"] for r in _records(tmp_path, "epoch")] == [1]
    assert not _records(tmp_path, "run_this")


def test_a_client_without_the_job_secret_is_refused_and_training_goes_on(tmp_path, caplog):
    with MonitorHub(world_size=1, config={}, run_dir=str(tmp_path), display=False) as hub:
        info = hub.link.info
        with pytest.raises(AuthenticationError):
            TcpTransport().connect(info.address, b"x" * 32, 0)
        # a probe that cannot reach the hub turns itself off with a warning instead of failing
        wrong = MonitorLink(ConnectInfo(info.address, b"y" * 32), 0.1)
        probe = Probe(wrong, rank=0)
        assert not probe.active and "live monitoring is off" in caplog.text
        probe.step_done(0.1, 1, 1.0)
        probe.close()
    assert not _records(tmp_path, "metrics")


def test_script_output_is_assembled_into_prefixed_lines(tmp_path, capsys):
    with MonitorHub(world_size=2, config={}, run_dir=None, display=True, interval_s=0.1) as hub:
        probe = Probe(hub.link, rank=1)
        probe.output("stdout", "hello ")
        probe.output("stdout", "world\nsecond line\nno newline at the end")
        probe.output("stdout", "x" * 300_000 + "\n")  # longer than one frame's chunk, whole
        probe.close()
        time.sleep(0.3)
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        "[rank 1] hello world",
        "[rank 1] second line",
        "[rank 1] no newline at the end" + "x" * 300_000,
    ]


def test_carriage_return_redraws_are_lines_and_pending_text_is_bounded(capsys):
    """A progress bar redrawn with \\r 20,000 times must neither pile up nor take quadratic time."""
    from sparkdp.monitor.hub import MAX_PENDING_CHARS

    with MonitorHub(world_size=1, config={}, run_dir=None, display=True, interval_s=0.1) as hub:
        started = time.perf_counter()
        for i in range(20_000):
            hub._on_report(0, {"type": "output", "stream": "stderr", "text": f"\rtraining {i / 200:5.1f}%"})
            assert len(hub._lines.get((0, "stderr"), "")) < 100
        elapsed = time.perf_counter() - started
        hub._on_report(0, {"type": "output", "stream": "stdout", "text": "a\rb\rc\rdone\n"})  # one chunk
        hub._on_report(0, {"type": "output", "stream": "stdout", "text": "y" * (3 * MAX_PENDING_CHARS + 5)})
        assert len(hub._lines[(0, "stdout")]) == 5
        for stream in ("evil", "x" * 1000, None):
            hub._on_report(0, {"type": "output", "stream": stream, "text": "z" * 1000})
        assert set(hub._lines) <= {(0, "stdout"), (0, "stderr")}
    assert elapsed < 10, f"20,000 redraws took {elapsed:.1f} s"
    captured = capsys.readouterr()
    assert "[rank 0] training  99.9%" in captured.err  # the last redraw, shown at the end
    out = captured.out.splitlines()
    assert "[rank 0] done" in out and not {"[rank 0] a", "[rank 0] b", "[rank 0] c"} & set(out)  # overdrawn
    assert out.count("[rank 0] " + "y" * MAX_PENDING_CHARS) == 3 and "[rank 0] yyyyy" in out
    assert not any("z" in line for line in out + captured.err.splitlines())


def test_the_monitoring_endpoint_uses_tls_when_the_job_does(tmp_path, monkeypatch):
    import sparkdp.spark.cluster as cluster
    from sparkdp.config import JobConfig
    from sparkdp.driver.monitoring import monitored
    from sparkdp.strategies.async_ps import AsyncParameterServer

    monkeypatch.setattr(cluster, "driver_host", lambda spark: "127.0.0.1")
    job = JobConfig.of(run_dir=str(tmp_path), show_progress=False)
    with monitored(job, None, 1, "t", strategy=AsyncParameterServer(tls=True)) as hub:
        assert hub.detector.own_parts == (
            "data_s",
            "compute_s",
            "comm_s",
        )  # asynchronous: its comm is its own
        info = hub.link.info
        assert info.tls_cert is not None and "BEGIN CERTIFICATE" in info.tls_cert
        shown = []
        monkeypatch.setattr(hub.display, "output", lambda text, stream: shown.append(text))
        probe = Probe(hub.link, rank=0)
        assert probe.active
        probe.output("stdout", "secret line\n")
        probe.close()
        _wait_for(lambda: shown == ["[rank 0] secret line"])
        plain = ConnectInfo(info.address, info.secret, None)  # a client that does not speak TLS gets nowhere:
        with pytest.raises((ConnectFailed, TimeoutError)):  # the server waits for a TLS hello, it for HELLO
            TcpTransport().connect(plain.address, plain.secret, 1, timeout=2.0).close()
    with monitored(job, None, 1, "t") as hub:
        assert hub.link.info.tls_cert is None


def test_credentials_in_urls_never_reach_the_run_log_or_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from sparkdp.redact import redact

    secrets_ = ["AKIAKEYID", "S3CR3T/value", "hunter2", "tok3n", "pw0rd"]
    config = {
        "checkpoint_dir": "s3://AKIAKEYID:S3CR3T/value@bucket/ckpt",
        "resume": None,
        "data": ["hdfs://alice:hunter2@namenode:8020/train?token=tok3n&part=1"],
        "master": "spark://u:pw0rd@host:7077",
        "mlflow": "https://bob:pw0rd@mlflow.example/x",
        "plain": "s3://bucket/no-credentials",
        "epochs": 3,
    }
    assert redact(config["plain"]) == "s3://bucket/no-credentials"
    assert redact(config["checkpoint_dir"]) == "s3://***@bucket/ckpt"
    assert redact(config["data"]) == ["hdfs://***@namenode:8020/train?token=***&part=1"]
    for url in [
        "https://storage.example/b/o?X-Goog-Credential=gc1&X-Goog-Signature=gs1&alt=media",
        "https://h/x?access_token=at1",
        "s3://b/k?X-Amz-Security-Token=st1&x=1",
        "https://h/cb?client_secret=cs1&password=pw1",
    ]:
        assert not {"gc1", "gs1", "at1", "st1", "cs1", "pw1"} & set(re.split(r"[=&?/]", redact(url))), redact(
            url
        )
    assert redact("https://h/x?alt=media&page=2") == "https://h/x?alt=media&page=2"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(RuntimeError):  # a job that fails with a URL in its error message
        with MonitorHub(
            world_size=1, config=config, run_dir=str(tmp_path / "run"), display=False, mlflow=uri
        ) as hub:
            hub.finish({"data": config["data"][0], "samples": 10})
            raise RuntimeError("cannot write checkpoints to 's3://AKIAKEYID:S3CR3T/value@bucket/ckpt'")
    logged = (tmp_path / "run" / "run.jsonl").read_text()
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("sparkdp").experiment_id])[0]
    params = json.dumps(run.data.params)
    for secret in secrets_:
        assert secret not in logged and secret not in params, secret
    assert (
        "s3://***@bucket/ckpt" in logged and "spark://***@host:7077" in params and '"epochs": "3"' in params
    )
    assert '"type": "failed"' in logged and "cannot write checkpoints to 's3://***@bucket/ckpt'" in logged


def test_the_per_worker_summary_counts_every_attempt_and_the_work_lost_since_a_checkpoint(capsys):
    """A worker whose counters start again was restarted by recovery: the table at the end
    shows the whole job's steps and samples, and as its own column the steps the failed attempt
    did after its last checkpoint (the work recovery redid), not the saved ones before it."""

    def metrics(steps: int, at: float, saved: int | None = None) -> dict:
        return {
            "type": "metrics",
            "time": at,
            "steps": steps,
            "samples": 32 * steps,
            "data_s": 0.0,
            "compute_s": float(steps),
            "comm_s": 0.0,
            "net_sent": 0,
            "net_recv": 0,
            "loss_sum": 0.0,
            **({"saved_steps": saved, "saved_samples": 32 * saved} if saved is not None else {}),
        }

    with MonitorHub(world_size=3, config={}, display=True, title="job") as hub:
        hub.display.stream = __import__("sys").stdout
        # worker 1 checkpointed at step 20, was killed after 30, then redid 10 from the checkpoint
        for steps, at, saved in ((10, 1.0, None), (30, 2.0, 20), (5, 3.0, None), (40, 4.0, None)):
            hub._on_report(1, metrics(steps, at, saved))
        # worker 2 never checkpointed: all of its failed attempt's 12 steps were lost
        for steps, at in ((12, 1.0), (3, 2.0)):
            hub._on_report(2, metrics(steps, at))
        hub._on_report(0, metrics(70, 4.0, 70))
        whole = hub.whole_job()
    assert (whole[1]["steps"], whole[1]["samples"], whole[1]["failed_steps"]) == (70, 70 * 32, 30)
    assert (whole[1]["lost_steps"], whole[1]["lost_samples"]) == (10, 10 * 32)
    assert (whole[2]["lost_steps"], whole[0]["lost_steps"], whole[0]["failed_steps"]) == (12, 0, 0)
    table = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()
        for line in table.splitlines()
        if line.split()[:1] in (["0"], ["1"], ["2"])
    }
    assert "steps lost" in table, table
    assert rows["1"][1:4] == ["70", "2,240", "10"] and rows["2"][3] == "12" and rows["0"][3] == "0", table


def test_an_epoch_a_retried_worker_reports_again_is_logged_but_not_shown_twice(tmp_path):
    with MonitorHub(world_size=2, config={}, run_dir=str(tmp_path), display=False) as hub:
        for epoch in (1, 2, 1, 3):  # rank 0's task was retried during epoch 2 and redid epoch 1
            hub._on_report(0, {"type": "epoch", "epoch": epoch, "loss": 1.0 / epoch})
        shown = [r["epoch"] for r in hub.epochs]
    assert shown == [1, 2, 3]
    logged = [(r["epoch"], r.get("repeated", False)) for r in _records(tmp_path, "epoch")]
    assert logged == [(1, False), (2, False), (1, True), (3, False)]


def test_processes_a_worker_started_are_labelled_with_their_worker():
    from sparkdp.monitor.display import Display
    from sparkdp.train.children import child_worker_id

    display = Display("job", 2, enabled=False)
    assert [display.worker_label(r) for r in (0, 1)] == ["0", "1"]
    assert [display.worker_label(child_worker_id(rank, 2, k)) for rank, k in ((0, 0), (1, 0), (1, 2))] == [
        "0.0",
        "1.0",
        "1.2",
    ]


def test_a_worker_that_took_no_step_since_its_last_report_adds_nothing_to_the_jobs_samples_per_s(tmp_path):
    """An asynchronous worker that finished (or one evaluating) trains no rows: the job's
    samples/s is the sum over the workers still stepping."""

    def record(rank, steps, at):
        return {
            "type": "metrics",
            "rank": rank,
            "time": at,
            "steps": steps,
            "samples": 64 * steps,
            "data_s": 0.0,
            "compute_s": 0.01 * steps,
            "comm_s": 0.0,
            "net_sent": 0,
            "net_recv": 0,
        }

    with MonitorHub(world_size=2, config={}, run_dir=str(tmp_path), display=False) as hub:
        for rank, steps in ((0, 10), (1, 10)):
            hub._on_report(rank, record(rank, steps, 1.0))
        hub._on_report(1, record(1, 20, 2.0))  # worker 1: 640 rows in 1 s
        hub._on_report(0, record(0, 10, 2.0))  # worker 0: done, no step since
        assert hub.latest[1]["samples_per_s"] == pytest.approx(640.0)
        assert hub.latest[0]["samples_per_s"] == 0.0
        assert hub._job_record()["samples_per_s"] == pytest.approx(640.0)


def _metrics_record(steps: int, at: float) -> dict:
    return {
        "type": "metrics",
        "time": at,
        "steps": steps,
        "samples": 32 * steps,
        "data_s": 0.0,
        "compute_s": 0.01 * steps,
        "comm_s": 0.0,
        "net_sent": 0,
        "net_recv": 0,
    }


def test_a_malformed_record_is_refused_and_the_workers_later_records_still_count(tmp_path, caplog):
    """Over the real endpoint: a metrics record without ``samples`` is refused with one logged
    line; the connection stays open and the worker's next records give the right rates."""
    with MonitorHub(world_size=1, config={}, run_dir=str(tmp_path), display=False) as hub:
        info = hub.link.info
        with TcpTransport().connect(info.address, info.secret, 0) as client:
            client.report(_metrics_record(10, 1.0))
            broken = _metrics_record(20, 2.0)
            del broken["samples"]
            client.report(broken)
            client.report(_metrics_record(30, 3.0))  # 20 steps of 32 rows in 2 s since the last kept record
            _wait_for(lambda: hub.latest.get(0, {}).get("steps") == 30)
        assert hub.latest[0]["samples_per_s"] == pytest.approx(320.0)
        assert hub.refused == {0: 1}
    assert "refused monitoring record 1 from worker 0: a 'metrics' record lacks 'samples'" in caplog.text
    assert [r["steps"] for r in _records(tmp_path, "metrics")] == [10, 30]
    assert _records(tmp_path, "job")[-1]["samples"] == 960


@pytest.mark.parametrize(
    "kind, change",
    [
        ("metrics", {"steps": "20"}),
        ("metrics", {"time": float("nan")}),
        ("metrics", {"samples": -1}),
        ("metrics", {"comm_s": float("inf")}),
        ("metrics", {"steps": True}),
        ("metrics", {"host": "h" * 300}),
        ("metrics", {"net_sent": None}),
        ("epoch", {"epoch": "2"}),
        ("epoch", {"epoch": None}),
        ("epoch_start", {"steps_per_epoch": "x"}),
        ("epoch_start", {"epochs": 0}),
        ("output", {"text": ["a"]}),
        ("output", {"stream": "stdin"}),
        ("server", {"shard": "0"}),
    ],
)
def test_records_of_the_wrong_type_or_range_are_refused_without_harm(kind, change, capsys):
    good = {
        "metrics": _metrics_record(20, 2.0),
        "epoch": {"type": "epoch", "epoch": 2, "loss": 0.5},
        "epoch_start": {"type": "epoch_start", "epoch": 2, "epochs": 3, "steps_per_epoch": 10},
        "output": {"type": "output", "stream": "stdout", "text": "hello\n"},
        "server": {"type": "server", "shard": 0, "time": 1.0},
    }
    with MonitorHub(world_size=2, config={}, display=True, title="job") as hub:
        hub.display.stream = __import__("sys").stdout
        hub._on_report(0, _metrics_record(10, 1.0))
        hub._on_report(0, {"type": "epoch", "epoch": 1, "loss": 1.0})
        hub._on_report(0, {**good[kind], **change})
        assert hub.refused == {0: 1}
        hub._on_report(0, good[kind])  # the same kind, well formed, still works
        hub._on_report(0, _metrics_record(30, 3.0))
        assert hub.latest[0]["samples_per_s"] == pytest.approx(320.0)
        assert [e["epoch"] for e in hub.epochs] == ([1, 2] if kind == "epoch" else [1])
        assert hub.refused == {0: 1}


def test_storage_credentials_never_reach_the_run_log_or_mlflow_and_the_log_is_private(tmp_path, monkeypatch):
    import os
    import stat

    from mlflow.tracking import MlflowClient

    import sparkdp.spark.cluster as cluster
    from sparkdp.config import JobConfig
    from sparkdp.driver.monitoring import monitored

    monkeypatch.setattr(cluster, "driver_host", lambda spark: "127.0.0.1")
    old_umask = os.umask(0o022)  # the usual umask, which leaves a plain open()'s file world-readable
    try:
        uri = f"sqlite:///{tmp_path}/mlflow.db"
        secrets_ = ["AKIAKEYID", "S3CR3T/val", "FwoGZXIvYXdzEJr", "AKIA2ND", "SECRET2ND", "SESSION2ND"]
        options = {
            "key": secrets_[0],
            "secret": secrets_[1],
            "token": secrets_[2],
            "endpoint_url": "http://minio.example:9000",
            "client_kwargs": {
                "region_name": "eu-west-1",
                "aws_access_key_id": secrets_[3],
                "aws_secret_access_key": secrets_[4],
                "aws_session_token": secrets_[5],
            },
        }
        job = JobConfig.of(
            run_dir=str(tmp_path / "run"),
            show_progress=False,
            mlflow=uri,
            checkpoint_dir=str(tmp_path / "ckpt"),
            checkpoint_storage_options=options,
        )
        with monitored(job, None, 1, "t") as hub:
            hub.finish({"samples": 10})
    finally:
        os.umask(old_umask)
    run_log = tmp_path / "run" / "run.jsonl"
    logged = run_log.read_text()
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("sparkdp").experiment_id])[0]
    params = json.dumps(run.data.params)
    for secret in secrets_:
        assert secret not in logged and secret not in params, secret
    header = json.loads(logged.splitlines()[0])["config"]["checkpoint_storage_options"]
    assert header["key"] == "***" and header["client_kwargs"]["aws_session_token"] == "***", header
    assert header["endpoint_url"] == "http://minio.example:9000"  # what is no secret stays readable
    assert "minio.example:9000" in run.data.params["checkpoint_storage_options"]
    assert stat.S_IMODE(run_log.stat().st_mode) == 0o600


def test_a_run_log_others_could_read_is_made_private_when_a_job_appends_to_it(tmp_path):
    import stat

    from sparkdp.monitor.sinks import RunLog

    (tmp_path / "run.jsonl").write_text('{"type": "header"}\n')
    (tmp_path / "run.jsonl").chmod(0o644)
    RunLog(tmp_path, {"config": {}}).close()
    assert stat.S_IMODE((tmp_path / "run.jsonl").stat().st_mode) == 0o600
    assert (tmp_path / "run.jsonl").read_text().startswith('{"type": "header"}\n')  # appended, not replaced


def test_steps_count_optimizer_steps_and_a_language_models_tokens_per_second_show(tmp_path, capsys):
    """With accumulate=2 only every second batch ends an optimizer step: progress counts those
    (as warmup_steps does), while rows and training tokens count every batch; tokens/s is the
    tokens between two reports over the time between them (hand-worked)."""
    with MonitorHub(world_size=1, config={}, run_dir=str(tmp_path), display=False, interval_s=60) as hub:
        probe = Probe(hub.link, rank=0)
        probe.start_epoch(0, 5, 1)
        for batch in range(10):  # 10 batches of 4 rows x 16 tokens, 5 optimizer steps
            probe.batch_arrived(0.0)
            probe.step_done(0.1, 4, 1.0, stepped=batch % 2 == 1, tokens=64)
        first = probe.snapshot()
        assert (first["steps"], first["step"], first["samples"], first["tokens"]) == (5, 5, 40, 640)
        probe.close()  # its last record reaches the hub; two more follow, 2 s apart
        _wait_for(lambda: 0 in hub.latest)
        now = time.time() + 100
        hub._on_report(0, {**first, "time": now})
        hub._on_report(0, {**first, "time": now + 2.0, "samples": 60, "steps": 7, "tokens": 960})
        assert hub.latest[0]["tokens_per_s"] == pytest.approx(160.0)  # (960 - 640) / 2 s
        hub.display.enabled = True
        hub.display.stream = __import__("sys").stdout
        headline = hub.display.headline()
        hub.display.epoch({"epoch": 1, "loss": 2.0, "test_loss": 1.5, "test_perplexity": 4.4817})
    assert "160 tokens/s" in headline, headline
    assert "test_perplexity 4.4817" in capsys.readouterr().out
    assert _records(tmp_path, "job")[-1]["tokens_per_s"] == pytest.approx(160.0)


def test_a_question_is_answered_after_the_epoch_listener_saw_the_epoch_it_carries(tmp_path):
    heard: list[int] = []

    def on_epoch(record):  # stop from epoch 2 on (a pruner's decision)
        heard.append(record["epoch"])
        return record["epoch"] >= 2

    with MonitorHub(world_size=2, config={}, run_dir=str(tmp_path), display=False, on_epoch=on_epoch) as hub:
        rank0, rank1 = Probe(hub.link, rank=0), Probe(hub.link, rank=1)
        assert rank1.ask("stop_query", epoch=1) == {"stop": False}  # nothing asked for yet
        assert rank0.ask("epoch", epoch=1, loss=2.0) == {"stop": False}
        assert rank0.ask("epoch", epoch=2, loss=1.0) == {"stop": True}  # the answer covers epoch 2
        assert heard == [1, 2] and hub.stop_after == 2
        # an asynchronous worker behind rank 0 trains on to the epoch the decision was made on
        assert rank1.ask("stop_query", epoch=1) == {"stop": False}
        assert rank1.ask("stop_query", epoch=2) == {"stop": True}
        assert rank1.ask("stop_query", epoch="x") == {"stop": True}  # refused as a record, still answered
        for probe in (rank0, rank1):
            probe.close()
    assert [r["epoch"] for r in _records(tmp_path, "epoch")] == [1, 2]  # kept like any epoch record
    assert not _records(tmp_path, "stop_query")


def test_a_driver_that_does_not_answer_stops_no_job(caplog):
    from sparkdp.monitor.probe import NoProbe

    assert NoProbe().ask("epoch", epoch=1) == {}
    with MonitorHub(world_size=1, config={}, display=False, on_epoch=lambda r: True) as hub:
        probe = Probe(hub.link, rank=0)
        hub.close()  # the driver went away
        assert probe.ask("epoch", epoch=1) == {} and probe.ask("epoch", epoch=2) == {}
        probe.close()
    assert sum("did not answer" in r.getMessage() for r in caplog.records) == 1  # logged once
