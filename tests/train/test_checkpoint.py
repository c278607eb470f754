"""Checkpoints: the file format, damage detection, resume on the same trajectory (world size 1),
divergence, and the driver's restart loop (with a stand-in for the Spark stage)."""

from __future__ import annotations

import copy
import json
import logging
import os
import struct
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from sparkdp.comm import SingleProcessCollective
from sparkdp.config import CheckpointConfig, JobConfig, TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.driver.controller import Attempt, Controller, RestartPolicy, ScalingPolicy
from sparkdp.driver.jobs.barrier import run_with_restarts
from sparkdp.driver.recovery import (
    merged_history,
    refuse_foreign_checkpoints,
    resume_point,
    resumed,
)
from sparkdp.errors import ConfigError, TrainingDiverged, WorkerFailed
from sparkdp.state import META_KEY, state_from_bytes
from sparkdp.strategies import STRATEGIES
from sparkdp.train.checkpoint import (
    CheckpointPolicy,
    check_compatible,
    check_writable,
    checkpoint_names,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from sparkdp.train.faults import fault_from_env
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss

pytestmark = pytest.mark.timeout(60)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))


def _data(rows: int = 200) -> TensorData:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 6, generator=g)
    return TensorData(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long())


def _spec(tmp_path: Path | None, epochs: int = 3, every: int | None = None, lr: float = 0.1) -> FitSpec:
    model = _model()
    policy = (
        CheckpointPolicy(CheckpointConfig(str(tmp_path), checkpoint_every=every, keep_checkpoints=100))
        if tmp_path is not None
        else None
    )
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=lr, momentum=0.9),
        strategy=STRATEGIES.create("allreduce"),
        train=_data(),
        eval=None,
        training=TrainingConfig(epochs=epochs, batch_size=16, seed=5),
        checkpoint=policy,
    )


def _save(directory: Path, epoch: int, step: int, keep: int = 3, job_id: str = "job-a") -> str:
    return save_checkpoint(
        CheckpointPolicy(CheckpointConfig(str(directory), keep_checkpoints=keep), job_id),
        epoch=epoch,
        step=step,
        model=_model().state_dict(),
        optimizer=b"\x01\x02",
        strategy_state={"steps": step},
        rng=[torch.get_rng_state()],
        history=[{"epoch": 1, "loss": 0.5, "samples": 10, "epoch_time_s": 1.0}],
        workers=1,
    )


def test_a_checkpoint_round_trips_and_only_the_newest_k_are_kept(tmp_path):
    for epoch, step in [(0, 10), (0, 20), (1, 0), (1, 10)]:
        _save(tmp_path, epoch, step, keep=3)
    assert checkpoint_names(tmp_path) == [
        "ckpt-e00000-s00000020-job-a.safetensors",
        "ckpt-e00001-s00000000-job-a.safetensors",
        "ckpt-e00001-s00000010-job-a.safetensors",
    ]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    ck = latest_checkpoint(tmp_path)
    assert (ck.epoch, ck.step, ck.optimizer, ck.strategy_state, ck.workers) == (
        1,
        10,
        b"\x01\x02",
        {"steps": 10},
        1,
    )
    for k, v in _model().state_dict().items():
        torch.testing.assert_close(ck.model[k], v, rtol=0, atol=0)
    _model()  # the RNG state _save stored: right after seeding and initialising a model
    assert torch.equal(ck.rng[0], torch.get_rng_state())


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, damage, caplog):
    _save(tmp_path, 0, 10)
    newest = Path(_save(tmp_path, 0, 20))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-5] ^= 0xFF  # one bit pattern inside the tensor bytes: only the digest notices
    newest.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        load_checkpoint(str(tmp_path), newest.name)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).step == 10
    assert "skipping the checkpoint" in caplog.text and newest.name in caplog.text


def test_bad_destinations_and_resume_targets_fail_at_the_start(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot write checkpoints to"):
        check_writable(blocker / "sub")
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        resume_point(JobConfig.of(resume=str(tmp_path)))
    with pytest.raises(ConfigError, match="keep_checkpoints must be a positive integer"):
        CheckpointConfig(keep_checkpoints=0)


def test_a_checkpoint_of_another_model_names_what_differs(tmp_path):
    _save(tmp_path, 0, 1)
    other = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3), nn.Linear(3, 3))
    with pytest.raises(
        ConfigError, match=r"not in the model.*|missing in the checkpoint: 4.bias.*shapes: 0.bias"
    ):
        check_compatible(other, latest_checkpoint(tmp_path))


def _weights(report) -> dict[str, torch.Tensor]:
    return state_from_bytes(report.state)


@pytest.mark.parametrize("where", [(1, 5), (2, 0)])
def test_resuming_continues_on_the_same_trajectory(tmp_path, where):
    """Stopped at (epoch, step), resumed from its checkpoint: the same weights, bit for bit,
    as one uninterrupted run (dropout draws included: every rank's RNG state is saved)."""
    full = fit_worker(_spec(None), SingleProcessCollective())
    fit_worker(_spec(tmp_path, every=5), SingleProcessCollective())
    name = next(
        n for n in checkpoint_names(tmp_path) if n.startswith(f"ckpt-e{where[0]:05d}-s{where[1]:08d}-")
    )
    checkpoint = load_checkpoint(str(tmp_path), name)
    spec = resumed(_spec(None), checkpoint)
    assert (spec.part.start_epoch, spec.part.start_step, spec.epochs) == (where[0], where[1], 3 - where[0])
    rest = fit_worker(spec, SingleProcessCollective())
    for k, v in _weights(full).items():
        torch.testing.assert_close(_weights(rest)[k], v, rtol=0, atol=0)
    history, samples, _ = merged_history(rest, spec)
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert samples == full.samples == 600
    for got, want in zip(history, full.history):  # the interrupted epoch's record covers all of it
        assert got["samples"] == want["samples"] and got["loss"] == pytest.approx(want["loss"], rel=1e-12)


def test_a_diverging_loss_stops_with_where_it_happened():
    with pytest.raises(TrainingDiverged, match=r"worker 0: the loss is (nan|inf) at epoch \d+, step \d+"):
        fit_worker(_spec(None, epochs=20, lr=1e4), SingleProcessCollective())


def test_averaging_checkpoints_only_where_the_replicas_agree():
    average = STRATEGIES.create("average", period=4)
    model = _model()
    average.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), SingleProcessCollective())
    agree = []
    for _ in range(8):
        average.after_step()
        agree.append(average.replicas_agree())
    assert agree == [False, False, False, True] * 2
    assert STRATEGIES.create("allreduce").replicas_agree()


def test_restarts_resume_from_the_latest_checkpoint_then_give_up_with_every_cause(tmp_path, caplog):
    spec = _spec(None, epochs=2)
    policy = CheckpointPolicy(CheckpointConfig(str(tmp_path)))
    seen = []

    def stage(attempt: FitSpec, now: Attempt):
        seen.append((attempt.part.start_epoch, attempt.part.start_step, attempt.fault))
        if len(seen) == 1:
            one_epoch = replace(attempt.part, epochs=1)
            fit_worker(
                replace(attempt, part=one_epoch, checkpoint=policy), SingleProcessCollective()
            )  # leaves e1-s0
        raise WorkerFailed(f"worker 1 died (attempt {len(seen)})")

    job = JobConfig.of(max_restarts=2)
    with caplog.at_level(logging.WARNING), pytest.raises(WorkerFailed) as info:
        run_with_restarts(spec, Controller(RestartPolicy.of(job), ScalingPolicy(1)), policy, stage)
    assert [s[:2] for s in seen] == [(0, 0), (1, 0), (1, 0)]
    assert "failed 3 times, more than max_restarts=2" in str(info.value)
    assert "1: worker 1 died (attempt 1); 2: worker 1 died (attempt 2)" in str(info.value)
    assert "restart 1 of 2 from the start of epoch 2" in caplog.text


def test_errors_a_restart_cannot_fix_are_raised_at_once(tmp_path):
    calls = []

    def stage(attempt, now):
        calls.append(1)
        raise ConfigError("bad setting")

    with pytest.raises(ConfigError):
        run_with_restarts(
            _spec(None),
            Controller(RestartPolicy.of(JobConfig.of()), ScalingPolicy(2)),
            CheckpointPolicy(CheckpointConfig(str(tmp_path))),
            stage,
        )
    assert calls == [1]


def test_fault_injection_setting_is_parsed_and_checked():
    assert fault_from_env({}) is None
    fault = fault_from_env({"SPARKDP_FAULT": "kill:rank=1:step=30"})
    assert (fault.action, fault.rank, fault.step) == ("kill", 1, 30)
    with pytest.raises(ConfigError, match="ACTION:rank=R:step=S"):
        fault_from_env({"SPARKDP_FAULT": "explode:rank=1"})
    with pytest.raises(RuntimeError, match="fault injected"):
        fault_from_env({"SPARKDP_FAULT": "raise:rank=0:step=2"}).maybe_fire(0, 2)
    copy.copy(fault).maybe_fire(0, 30)  # another rank: nothing happens
    driver = fault_from_env({"SPARKDP_FAULT": "kill-driver:step=3"})
    assert (driver.action, driver.rank, driver.step, driver.driver_pid) == ("kill-driver", 0, 3, os.getpid())


def test_an_elastic_restart_continues_on_the_slots_left_and_grows_back(tmp_path, caplog):
    """Two workers; after the first failure one slot is left (min_workers=1): the restart runs
    on one worker from the same rows; after the second, both slots are back."""
    spec, policy = _spec(None, epochs=2), CheckpointPolicy(CheckpointConfig(str(tmp_path)))
    save_checkpoint(
        policy,
        epoch=0,
        step=6,
        model=_model().state_dict(),
        optimizer=b"",
        strategy_state={},
        rng=[torch.get_rng_state()] * 2,
        history=[],
        workers=2,
    )
    slots = iter([1, 2])
    runs = []

    def stage(attempt: FitSpec, now: Attempt):
        runs.append((now.workers, attempt.part.start_step))
        if len(runs) < 3:
            raise WorkerFailed("the executor running worker 1 was lost")
        return "report"

    job = JobConfig.of(max_restarts=3, min_workers=1)
    with caplog.at_level(logging.WARNING):
        report, _, workers = run_with_restarts(
            spec,
            Controller(RestartPolicy.of(job), ScalingPolicy.of(job, 2, lambda: next(slots))),
            policy,
            stage,
        )
    assert (report, workers) == ("report", 2)
    assert runs == [(2, 0), (1, 12), (2, 6)]  # step 6 of 2 workers = step 12 of one: the same rows
    assert "restart 1 of 3 from epoch 1, step 6 on 1 of 2 workers (task slots gone)" in caplog.text
    with pytest.raises(ConfigError, match=r"min_workers \(3\) cannot exceed workers \(2\)"):
        JobConfig.of(workers=2, min_workers=3)


def test_slow_by_factor_stretches_the_chosen_ranks_steps():
    import time

    fault = fault_from_env({"SPARKDP_FAULT": "slow:rank=1,3:step=1:factor=3"})
    assert (fault.rank, fault.more_ranks, fault.factor) == (1, (3,), 3.0)
    for rank in (3, 0):
        fault.maybe_fire(rank, 1)  # rank 3's first step: nothing to scale yet; rank 0 is not slowed
        start = time.perf_counter()
        time.sleep(0.05)  # the step's own work
        fault.maybe_fire(rank, 2)
        took = time.perf_counter() - start
        assert (took >= 0.05 * 3 * 0.95) if rank == 3 else (took < 0.05 * 2), (rank, took)
    with pytest.raises(ConfigError, match="F >= 1"):
        fault_from_env({"SPARKDP_FAULT": "slow:rank=1:step=1:factor=0.5"})
    with pytest.raises(ConfigError, match="ACTION:rank=R:step=S"):
        fault_from_env({"SPARKDP_FAULT": "kill:rank=1,2:step=3"})  # several ranks: slow only


# ----------------------------------------------------------- two jobs, one directory
def _rewrite_header(path: Path, edit) -> None:
    """Apply ``edit`` to a safetensors file's JSON header, keeping the header's length (padded with spaces)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= size
    path.write_bytes(data[:8] + text.ljust(size) + data[8 + size :])


def test_rotation_never_deletes_the_file_just_written_nor_another_jobs(tmp_path):
    """An earlier, longer job left newer-named checkpoints and a damaged one; a second job writing
    there with keep=2 must keep its own newest two and touch nothing else."""
    for epoch in (4, 5):
        _save(tmp_path, epoch, 0, job_id="earlier-long-job")
    damaged = tmp_path / "ckpt-e00009-s00000000-earlier-long-job.safetensors"
    damaged.write_bytes(b"\x00" * 40)
    written = [Path(_save(tmp_path, 0, step, keep=2, job_id="second-job")).name for step in (10, 20, 30)]
    names = checkpoint_names(tmp_path)
    assert written[1:] == [
        n for n in names if n.startswith("ckpt-e00000")
    ]  # its newest two, the last included
    assert {
        "ckpt-e00004-s00000000-earlier-long-job.safetensors",
        "ckpt-e00005-s00000000-earlier-long-job.safetensors",
        damaged.name,
    } <= set(names)


def test_a_restart_resumes_this_jobs_checkpoint_never_another_jobs(tmp_path):
    _save(tmp_path, 5, 0, job_id="other-job")  # newer by name than anything this job writes
    policy = CheckpointPolicy(CheckpointConfig(str(tmp_path), keep_checkpoints=100), "this-job")
    save_checkpoint(
        policy,
        epoch=0,
        step=6,
        model=_model().state_dict(),
        optimizer=b"",
        strategy_state={},
        rng=[torch.get_rng_state()],
        history=[],
        workers=1,
    )
    assert latest_checkpoint(tmp_path, "this-job").step == 6
    assert latest_checkpoint(tmp_path, "nobody") is None
    starts = []

    def stage(attempt: FitSpec, now: Attempt):
        starts.append((attempt.part.start_epoch, attempt.part.start_step))
        if len(starts) == 1:
            raise WorkerFailed("worker 0 died")
        return "report"

    run_with_restarts(
        _spec(None, epochs=2),
        Controller(RestartPolicy.of(JobConfig.of(max_restarts=1)), ScalingPolicy(1)),
        policy,
        stage,
    )
    assert starts == [(0, 0), (0, 6)]  # epoch 6 of the other job would have been (5, 0)


def test_a_new_job_refuses_a_directory_holding_another_jobs_checkpoints(tmp_path):
    refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path / "absent")))  # nothing there: fine
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path)))
    first = Path(_save(tmp_path, 2, 0, job_id="earlier"))
    with pytest.raises(ConfigError, match=r"already holds checkpoints of another job.*resume=.*empty or new"):
        refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path)))
    # resuming that job in place is its own lineage, a damaged file of its own is skipped, not foreign
    (tmp_path / "ckpt-e00003-s00000000-earlier.safetensors").write_bytes(b"junk")
    refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path), resume=str(tmp_path)), "earlier")
    with pytest.raises(ConfigError, match="another job"):  # but not a third job's identity
        refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path), resume=str(tmp_path)), "third")
    elsewhere = tmp_path / "new"
    elsewhere.mkdir()
    (elsewhere / first.name).write_bytes(first.read_bytes())
    (elsewhere / "ps-000001-0123abcd.safetensors").write_bytes(
        b"a server checkpoint of some asynchronous job"
    )
    with pytest.raises(ConfigError, match="ps-000001-0123abcd"):  # resuming from one directory into another's
        refuse_foreign_checkpoints(
            JobConfig.of(checkpoint_dir=str(elsewhere), resume=str(tmp_path)), "earlier"
        )


def test_a_job_that_resumes_keeps_its_identity_in_new_checkpoints(tmp_path):
    from sparkdp.driver.recovery import checkpoint_policy

    _save(tmp_path, 0, 10, job_id="lineage")
    start = resume_point(JobConfig.of(resume=str(tmp_path)))
    assert start.job_id == "lineage"
    with checkpoint_policy(
        JobConfig.of(resume=str(tmp_path), keep_checkpoints=7), temporary_ok=False, job_id=start.job_id
    ) as policy:
        assert policy.job_id == "lineage"
        # the resolved settings: checkpoint_dir is where this run writes (resume's directory here)
        assert (policy.settings.checkpoint_dir, policy.directory) == (str(tmp_path), str(tmp_path))
        assert (policy.settings.resume, policy.settings.keep_checkpoints) == (str(tmp_path), 7)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        CheckpointPolicy(CheckpointConfig())
    with checkpoint_policy(JobConfig.of(checkpoint_dir=str(tmp_path / "b")), temporary_ok=False) as fresh:
        assert fresh.job_id and fresh.job_id != "lineage"


# ----------------------------------------------------------- what the digest covers
def test_the_digest_covers_dtypes_and_shapes(tmp_path):
    """The same bytes read as another dtype and shape are not the checkpoint that was written."""
    _save(tmp_path, 0, 10)
    path = Path(_save(tmp_path, 0, 20))

    def reinterpret(header):
        entry = next(
            v
            for k, v in header.items()
            if k != "__metadata__" and v["dtype"] == "F32" and len(v["shape"]) == 2
        )
        entry["dtype"] = "I32"  # same size per element: the bytes alone still hash the same
        entry["shape"] = [entry["shape"][0] * entry["shape"][1]]

    _rewrite_header(path, reinterpret)
    with pytest.raises(ValueError, match="SHA-256 does not match"):
        load_checkpoint(str(tmp_path), path.name)
    assert latest_checkpoint(tmp_path).step == 10


@pytest.mark.parametrize(
    "skeleton",
    [
        "[]",
        '{"format": 1}',
        '{"format": 1, "epoch": "x", "step": 0}',
        '{"__tensor__": "missing"}',
        '{"__items__": 5}',
    ],
)
def test_a_malformed_checkpoint_with_a_correct_digest_is_skipped_like_a_damaged_one(
    tmp_path, skeleton, caplog
):
    from safetensors.torch import save as st_save

    from sparkdp.train.checkpoint_store import digest

    _save(tmp_path, 0, 10)
    bad = tmp_path / "ckpt-e00000-s00000020-job-a.safetensors"
    wrapped = f'{{"job_id": "job-a", "series": "ckpt", "state": {skeleton}}}'
    bad.write_bytes(st_save({}, metadata={META_KEY: wrapped, "sha256": digest({}, wrapped)}))
    with pytest.raises(ValueError):
        load_checkpoint(str(tmp_path), bad.name)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).step == 10
    assert bad.name in caplog.text


def test_a_file_whose_header_does_not_read_breaks_nothing(tmp_path, caplog):
    """A checkpoint-named file with a deeply nested header: skipped by resume, passed over by
    rotation, no RecursionError anywhere."""
    deep = b"[" * 100_000 + b"]" * 100_000
    bad = tmp_path / "ckpt-e00009-s00000000-j.safetensors"
    bad.write_bytes(struct.pack("<Q", len(deep)) + deep)
    written = Path(_save(tmp_path, 0, 10, keep=1, job_id="j"))
    Path(_save(tmp_path, 0, 20, keep=1, job_id="j"))
    assert not written.exists() and bad.exists()  # rotation ran past the unreadable file
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path, "j").step == 20
    assert bad.name in caplog.text
    with pytest.raises(ConfigError, match="another job"):
        refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path)))


def test_resuming_into_a_new_directory_can_be_run_again(tmp_path):
    """A checkpoint resumed into another directory: the first run writes there under the
    checkpoint's identity, so the same command run again (after the driver died) is not refused
    as another job's; a third job's files there are."""
    old, new = tmp_path / "old", tmp_path / "new"
    ck = load_checkpoint(str(old), Path(_save(old, 1, 0, job_id="first")).name)
    assert ck.job_id == "first"
    job = JobConfig.of(resume=str(old), checkpoint_dir=str(new))
    refuse_foreign_checkpoints(job, ck.job_id)  # new is empty
    _save(new, 1, 10, job_id=ck.job_id)  # the first run's checkpoint, then the driver died
    refuse_foreign_checkpoints(job, resume_point(job).job_id)  # the same command again
    _save(new, 1, 20, job_id="someone-else")
    with pytest.raises(ConfigError, match="This job resumes from .*: give it a checkpoint_dir of its own"):
        refuse_foreign_checkpoints(job, resume_point(job).job_id)


def test_resuming_a_directory_of_two_jobs_is_refused_unless_resume_job_names_one(tmp_path, caplog):
    """resume=DIR with a checkpoint_dir of its own: DIR holding two jobs' checkpoints is refused
    with both identities and how to choose; resume_job picks one (not the newest, here); the
    job resumed is named in one log line."""
    _save(tmp_path, 1, 0, job_id="job-a")
    _save(tmp_path, 0, 30, job_id="job-a")
    _save(tmp_path, 2, 0, job_id="job-b")  # the newest file in DIR
    elsewhere = str(tmp_path / "new")
    with pytest.raises(
        ConfigError, match=r"2 jobs: job-a \(newest ckpt-e00001-s00000000-job-a.*job-b .*resume_job=JOB"
    ):
        resume_point(JobConfig.of(resume=str(tmp_path), checkpoint_dir=elsewhere))
    with caplog.at_level(logging.INFO, logger="sparkdp"):
        start = resume_point(JobConfig.of(resume=str(tmp_path), checkpoint_dir=elsewhere, resume_job="job-a"))
    assert (start.job_id, start.epoch, start.step) == ("job-a", 1, 0)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resuming")]
    assert line == f"resuming job job-a from {tmp_path / 'ckpt-e00001-s00000000-job-a.safetensors'}"
    with pytest.raises(
        ConfigError, match=r"resume_job='job-c'.*holds no checkpoint of that job.*job-a .*job-b"
    ):
        resume_point(JobConfig.of(resume=str(tmp_path), checkpoint_dir=elsewhere, resume_job="job-c"))
    alone = tmp_path / "alone"
    _save(alone, 0, 5, job_id="job-d")
    assert resume_point(JobConfig.of(resume=str(alone), checkpoint_dir=elsewhere)).job_id == "job-d"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"resume_job": "job-a"}, "give resume=DIR"),
        ({"resume": "d", "resume_job": "a/b"}, "expected a job's identity"),
        ({"resume": "d", "resume_job": ""}, "expected a job's identity"),
        ({"resume": "d", "resume_job": 7}, "expected a job's identity"),
    ],
)
def test_a_resume_job_that_cannot_name_a_job_is_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        CheckpointConfig(**settings)
