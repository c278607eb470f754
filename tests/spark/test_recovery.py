"""A worker process killed mid-epoch (SIGKILL, injected with SPARKDP_FAULT): the driver restarts
the barrier stage from the latest checkpoint and the job ends where an uninterrupted one does."""

from __future__ import annotations

import logging
import os
import re
import signal
import time

import pytest
import torch

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def fashion():
    return dataset_tensors(load_dataset("fashion-mnist", limit=6000))


def _fit(spark, data, **kw):
    train, test = data
    torch.manual_seed(0)
    model = build_model("cnn-small", dropout=0.3)  # dropout: the resumed RNG streams matter
    return sparkdp.fit(
        model,
        train,
        eval_data=test,
        workers=2,
        epochs=2,
        batch_size=64,
        spark=spark,
        memory_format="contiguous",
        show_progress=False,
        **kw,
    )


def _same_weights(a, b) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], rtol=0, atol=0)


def _lines(caplog) -> list[str]:
    """The controller's lines: one per failure ("-- restart"), one per recovery."""
    return [
        r.getMessage()
        for r in caplog.records
        if "-- restart" in r.getMessage() or r.getMessage().startswith("sparkdp: recovered")
    ]


@pytest.fixture(scope="module")
def uninterrupted(spark, fashion):
    return _fit(spark, fashion)


def test_killed_worker_restarts_from_the_latest_checkpoint(
    spark, fashion, uninterrupted, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=30")  # 47 steps per epoch
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion, checkpoint_dir=str(tmp_path), checkpoint_every=20)
    restarts = _lines(caplog)
    assert len(restarts) == 2 and restarts[1].startswith(
        "sparkdp: recovered from failure 1 (worker 1 died"
    ), restarts
    assert "worker 1 died" in restarts[0] and "restart 1 of 3 from epoch 1, step 20" in restarts[0]
    assert restarts[1].endswith(") on 2 of 2 workers"), restarts
    [failure] = result.details["restarts"]  # the whole job's account: the failure and its attempt's time
    assert (
        failure["restart_from"] == "epoch 1, step 20" and failure["workers"] == 2 and failure["attempt_s"] > 0
    )
    assert result.summary()["restarts"] == 1 and result.summary()["failed_attempts_s"] == failure["attempt_s"]
    _same_weights(uninterrupted, result)  # NCHW, same seed: the same trajectory, bit for bit
    assert abs(result.test_accuracy - uninterrupted.test_accuracy) <= 0.005
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert [h["samples"] for h in result.history] == [h["samples"] for h in uninterrupted.history]


def test_without_a_checkpoint_dir_recovery_still_works(spark, fashion, uninterrupted, monkeypatch, caplog):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=0:step=60")  # epoch 2: after the epoch-1 checkpoint
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion)
    assert any("restart 1 of 3 from the start of epoch 2" in r.getMessage() for r in caplog.records)
    _same_weights(uninterrupted, result)


def test_max_restarts_zero_fails_with_one_readable_line(spark, fashion, monkeypatch):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=3")
    with pytest.raises(sparkdp.WorkerFailed) as info:
        _fit(spark, fashion, max_restarts=0)
    message = str(info.value)
    assert message.startswith("worker 1 died: its Python process exited unexpectedly")
    assert "\n" not in message and "at org.apache" not in message


@pytest.mark.parametrize(
    ("stopped", "waiting"), [(1, 0)]
)  # a stopped rank 0 is not recovered: see docs/guide/reliability.md
def test_a_stopped_worker_is_detected_by_the_collective_timeout_named_and_recovered(
    spark, fashion, uninterrupted, tmp_path, monkeypatch, caplog, stopped, waiting
):
    monkeypatch.setenv("SPARKDP_FAULT", f"stop:rank={stopped}:step=30")  # SIGSTOP: alive, but no progress
    # short, so that the wait for the stopped worker is short, yet well above a step's time under load
    timeout_s = 8
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(
            spark, fashion, checkpoint_dir=str(tmp_path), checkpoint_every=20, pg_timeout_s=timeout_s
        )
    elapsed = time.monotonic() - started
    restarts = [line for line in _lines(caplog) if "-- restart" in line]
    assert len(restarts) == 1 and "from epoch 1, step 20" in restarts[0], restarts
    assert (
        f"worker {stopped} stopped making progress; worker {waiting} timed out waiting for it in a "
        f"collective (after {timeout_s} s)"
    ) in restarts[0], restarts
    _same_weights(uninterrupted, result)
    assert elapsed < timeout_s + 120, f"the stopped worker was not detected in time ({elapsed:.0f} s)"


def test_a_killed_asynchronous_worker_restarts_as_max_restarts_allows(spark, fashion, monkeypatch, caplog):
    """A server on the driver: Spark's own retry of the killed task stops at once, so the job's
    restart policy decides: max_restarts=0 fails on the first kill, 1 recovers (the server keeps
    its centre and every worker's sequence numbers, so no push counts twice)."""
    train, test = fashion

    def run(**kw):
        torch.manual_seed(0)
        return sparkdp.fit(
            torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)),
            train,
            eval_data=test,
            workers=2,
            epochs=1,
            batch_size=64,
            spark=spark,
            show_progress=False,
            strategy="asgd",
            strategy_options={"rule_options": {"lr": 0.05}},
            optimizer_options={"lr": 0.05, "momentum": 0.0},
            **kw,
        )

    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=30")  # 47 steps per epoch and worker
    with pytest.raises(sparkdp.WorkerFailed, match=r"^worker 1's task failed"):
        run(max_restarts=0)
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = run(max_restarts=1)
    cause = "worker 1's task failed (Spark's retry of it stops: the job's restart policy decides)"
    assert _lines(caplog) == [
        f"sparkdp: {cause} -- restart 1 of 1 from the parameter server's current centre",
        f"sparkdp: recovered from failure 1 ({cause}) on 2 of 2 workers",
    ], _lines(caplog)
    server = result.details["server"]
    assert server["rejected"] == 0 and server["duplicates_dropped"] == 0
    finished = sum(w["pushes"] for w in result.details["per_worker"])
    assert server["pushes_applied"] >= finished + 30, (server, result.details["per_worker"])
    assert result.test_accuracy > 0.55, result.test_accuracy


def test_a_streamed_dataframe_epoch_is_rerun_and_checkpoints_resume(spark, tmp_path, monkeypatch, caplog):
    """The DataFrame path: the driver holds every epoch's state, so a failed epoch stage runs
    again from it; its epoch-end checkpoints resume a later job on the same trajectory."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(800, 4, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    df = (
        spark.createDataFrame(
            [(row.tolist(), int(t)) for row, t in zip(x, y, strict=True)], "x array<float>, y long"
        )
        .repartition(2)
        .cache()
    )

    def fit(epochs, **kw):
        torch.manual_seed(0)
        return sparkdp.fit(
            torch.nn.Linear(4, 2),
            df,
            features="x",
            label="y",
            workers=2,
            epochs=epochs,
            batch_size=16,
            spark=spark,
            show_progress=False,
            **kw,
        )

    try:
        clean = fit(2)
        monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=0:step=10")
        with caplog.at_level(logging.WARNING, logger="sparkdp"):
            rerun = fit(2, checkpoint_dir=str(tmp_path))
        monkeypatch.delenv("SPARKDP_FAULT")
        lines = _lines(caplog)
        assert len(lines) == 2 and "restart 1 of 3 from the start of epoch 1" in lines[0], lines
        assert lines[1].startswith("sparkdp: recovered from failure 1 (worker 0 died") and lines[1].endswith(
            "on 2 of 2 workers"
        ), lines
        _same_weights(clean, rerun)
        resumed = fit(3, resume=str(tmp_path))  # continues after epoch 2 with a third
        longer = fit(3)
    finally:
        df.unpersist()
    _same_weights(longer, resumed)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]


def test_an_asynchronous_job_resumes_its_parameter_server(spark, fashion, tmp_path):
    """The server's state is checkpointed (at the end at least); resume restores the centre and
    every worker's push sequence, and runs only the epochs the applied pushes do not cover."""
    train, test = fashion
    options = {
        "strategy": "asgd",
        "strategy_options": {"rule_options": {"lr": 0.05}, "push_every": 4},
        "optimizer_options": {"lr": 0.05, "momentum": 0.0},
    }
    torch.manual_seed(0)
    first = sparkdp.fit(
        build_model("cnn-small"),
        train,
        eval_data=test,
        workers=2,
        epochs=1,
        spark=spark,
        show_progress=False,
        checkpoint_dir=str(tmp_path),
        **options,
    )
    assert [re.sub(r"-[0-9a-f]{16}\.", "-JOB.", p.name) for p in tmp_path.iterdir()] == [
        "ps-000000-JOB.safetensors"
    ]
    # the same job, resumed: its one epoch is covered, so the model is the saved centre
    same = sparkdp.fit(
        build_model("cnn-small"),
        train,
        eval_data=test,
        workers=2,
        epochs=1,
        spark=spark,
        show_progress=False,
        resume=str(tmp_path),
        **options,
    )
    _same_weights(first, same)
    assert same.details["server"]["pushes_applied"] == 0
    # a second epoch continues from it: every worker's sequence numbers go on, nothing is rejected
    more = sparkdp.fit(
        build_model("cnn-small"),
        train,
        eval_data=test,
        workers=2,
        epochs=2,
        spark=spark,
        show_progress=False,
        resume=str(tmp_path),
        **options,
    )
    assert [h["epoch"] for h in more.history] == [2]
    server = more.details["server"]
    assert server["rejected"] == 0 and server["duplicates_dropped"] == 0 and server["pushes_applied"] > 0
    assert more.test_accuracy >= first.test_accuracy - 0.03


def test_a_streamed_dataframe_job_continues_on_fewer_workers_down_to_min_workers(spark, monkeypatch, caplog):
    """After a failure that took task slots away (here: Spark reports one free slot), the epoch
    reruns on the workers left, down to min_workers, and the job finishes there."""
    from sparkdp.spark import cluster

    g = torch.Generator().manual_seed(1)
    x = torch.randn(600, 4, generator=g)
    y = (x[:, 0] + x[:, 2] > 0).long()
    df = (
        spark.createDataFrame(
            [(row.tolist(), int(t)) for row, t in zip(x, y, strict=True)], "x array<float>, y long"
        )
        .repartition(2)
        .cache()
    )
    monkeypatch.setattr(cluster, "available_slots", lambda sc: 1)
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=5")
    try:
        torch.manual_seed(0)
        with caplog.at_level(logging.WARNING, logger="sparkdp"):
            result = sparkdp.fit(
                torch.nn.Linear(4, 2),
                df,
                features="x",
                label="y",
                workers=2,
                min_workers=1,
                epochs=2,
                batch_size=16,
                spark=spark,
                show_progress=False,
            )
    finally:
        df.unpersist()
    restarts = _lines(caplog)
    assert (
        len(restarts) == 2 and "restart 1 of 3 from the start of epoch 1 on 1 of 2 workers" in restarts[0]
    ), restarts
    assert restarts[1].endswith("on 1 of 2 workers"), restarts
    assert result.workers == 1 and [h["epoch"] for h in result.history] == [1, 2]
    assert sum(h["samples"] for h in result.history) == 2 * 600  # every row, on the one worker left
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_a_launched_script_is_restarted_and_sees_its_restart_number(spark, tmp_path, caplog):
    """sparkdp.launch restarts a script whose worker was killed, as torchrun would: the second
    attempt reads TORCHELASTIC_RESTART_COUNT=1 and the job's checkpoint directory."""
    script = tmp_path / "elastic.py"
    script.write_text(
        "import os, signal\n"
        "restart, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']\n"
        "open(os.path.join(os.environ['SPARKDP_CHECKPOINT_DIR'], f'seen-{restart}-{rank}'), 'w').close()\n"
        "if restart == '0' and rank == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        sparkdp.launch(
            script,
            spark=spark,
            workers=2,
            max_restarts=1,
            checkpoint_dir=str(checkpoints),
            show_progress=False,
        )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["seen-0-0", "seen-0-1", "seen-1-0", "seen-1-1"]
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("sparkdp: worker 1 died") and lines[0].endswith(
        "-- restart 1 of 1 from the start (the workers' own code resumes from its checkpoints)"
    ), lines
    assert lines[1].startswith("sparkdp: recovered from failure 1 (worker 1 died") and lines[1].endswith(
        "on 2 of 2 workers"
    ), lines


@pytest.mark.distributed
@pytest.mark.slow  # (make test-all) ~30 s; tests/train/test_preempt.py stops two ranks at a step in make test
def test_a_preempted_worker_saves_first_and_the_restart_is_free(
    spark, fashion, uninterrupted, tmp_path, monkeypatch, caplog
):
    # worker 1 gets SIGTERM after its 30th step (47 a epoch); no periodic checkpoints, and no
    # restarts allowed: only the checkpoint the preemption saves lets the job go on
    monkeypatch.setenv("SPARKDP_FAULT", "term:rank=1:step=30")
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion, checkpoint_dir=str(tmp_path), max_restarts=0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sparkdp: ")]
    [preemption] = result.details["preemptions"]
    where = preemption["restart_from"]
    # saved where the ranks agreed, after the signal: no step before it is lost (the agreement
    # comes about every half second, so a few steps later at most)
    assert re.fullmatch(r"epoch 1, step (\d+)", where) and 30 <= int(where.split()[-1]) < 47, where
    why = (
        "preempted: worker 1 received SIGTERM or SIGHUP (its executor or machine is going away); saved a "
        f"checkpoint at {where}"
    )
    assert lines == [
        f"sparkdp: {why} -- preemption 1, restart from {where} (preemptions do not count against max_restarts)",
        f"sparkdp: recovered from preemption 1 ({why}) on 2 of 2 workers",
    ], lines
    assert result.details["restarts"] == []
    _same_weights(uninterrupted, result)  # resumed at the step it stopped: the same trajectory


@pytest.mark.slow  # the quick siblings: tests/strategies/test_fsdp.py (resharding, the loop's resume)
def test_an_fsdp_job_continues_on_fewer_workers_from_its_sharded_checkpoint(
    spark, tmp_path, monkeypatch, caplog
):
    """fsdp on 2 workers writes sharded checkpoints (each worker its own shards); a worker is
    killed and only one task slot is left (as Spark would say), so the job resumes its sharded
    checkpoint on 1 worker (min_workers=1), which loads both shards, and finishes there."""
    from sparkdp.spark import cluster
    from sparkdp.train.checkpoint import latest_checkpoint

    g = torch.Generator().manual_seed(3)
    x = torch.randn(640, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()

    def fit(**kw):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
        return sparkdp.fit(
            model,
            (x, y),
            epochs=2,
            batch_size=8,
            optimizer="adamw",
            optimizer_options={"lr": 0.01},
            strategy="fsdp",
            strategy_options={"min_params": 100},
            spark=spark,
            show_progress=False,
            **kw,
        )

    monkeypatch.setattr(cluster, "available_slots", lambda sc: 1)
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=30")  # 40 steps per epoch and worker
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = fit(workers=2, min_workers=1, checkpoint_dir=str(tmp_path), checkpoint_every=20)
    restarts = _lines(caplog)
    assert len(restarts) == 2 and "restart 1 of 3 from epoch 1, step 20 on 1 of 2 workers" in restarts[0], (
        restarts
    )
    assert result.workers == 1 and [h["epoch"] for h in result.history] == [1, 2]
    assert sum(h["samples"] for h in result.history) == 2 * 640  # the killed epoch counted once, in full
    # the sharded checkpoint the restart read: both workers' shards, committed by one manifest
    [manifest] = [p for p in tmp_path.glob("shards-e00000-s00000020-*.manifest.json")]
    shards = sorted(p.name for p in tmp_path.joinpath(manifest.name.removesuffix(".manifest.json")).iterdir())
    assert shards == ["loop-state", *(f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2))]
    last = latest_checkpoint(tmp_path)  # one worker saves its whole state again
    assert last is not None and (last.epoch, last.workers, last.shards) == (2, 1, "")
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_fit_workers_and_run_functions_see_the_jobs_restart_number_and_max_restarts(
    spark, tmp_path, monkeypatch
):
    """As under torchrun, every worker of an attempt reads the job's restart number and its
    max_restarts: a fit worker (here its loss function) after an injected kill, and a run
    function after its own."""
    seen = str(tmp_path)

    def note(kind: str) -> str:
        env = os.environ
        restart = env["TORCHELASTIC_RESTART_COUNT"]
        name = f"{kind}-{restart}-{env['TORCHELASTIC_MAX_RESTARTS']}-{env['RANK']}"
        open(os.path.join(seen, name), "w").close()
        return restart

    def loss(out, y):
        if "RANK" in os.environ:  # a worker (the driver's preflight runs the loss too)
            note("fit")
        return torch.nn.functional.cross_entropy(out, y)

    def train_fn():
        if note("run") == "0" and os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)
    settings = {"workers": 2, "max_restarts": 2, "spark": spark, "show_progress": False}
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=2")  # 4 steps per worker
    sparkdp.fit(torch.nn.Linear(4, 2), (x, y), loss=loss, epochs=1, batch_size=8, **settings)
    monkeypatch.delenv("SPARKDP_FAULT")
    sparkdp.run(train_fn, **settings)
    assert sorted(os.listdir(seen)) == [
        f"{kind}-{restart}-2-{rank}" for kind in ("fit", "run") for restart in (0, 1) for rank in (0, 1)
    ]
