"""Parameter-server checkpoints: resume skips damaged files, a failed periodic save does not end
periodic saving, and two jobs' server checkpoints in one directory are told apart by the
identity each carries (rotation, resume and the start-of-job check). No Spark: the server,
the saver and the resume step directly."""

from __future__ import annotations

import errno
import logging
import threading

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from sparkdp import state as state_io
from sparkdp.config import JobConfig, TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.driver.async_job import server_factory
from sparkdp.driver.jobs.driver_server import resume_server, server_lineage
from sparkdp.driver.recovery import refuse_foreign_checkpoints
from sparkdp.errors import ConfigError
from sparkdp.strategies import AsyncParameterServer
from sparkdp.train.checkpoint_manager import CheckpointManager, ServerCheckpoints
from sparkdp.train.checkpoint_store import server_series
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory, resolve_loss

pytestmark = pytest.mark.timeout(60)

STRATEGY = AsyncParameterServer("asgd", {"lr": 1.0})


def _spec(model: nn.Module) -> FitSpec:
    x, y = torch.zeros(16, 4), torch.zeros(16, dtype=torch.long)
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.1),
        strategy=STRATEGY,
        train=TensorData(x, y),
        eval=None,
        training=TrainingConfig(epochs=3, batch_size=8),
    )


def _server(model: nn.Module):
    return server_factory(STRATEGY, 1)(list(model.parameters()))


JOB = "job-a"
NEWEST = f"ps-000001-{JOB}.safetensors"


def _store(directory, job_id: str = JOB, keep: int = 3) -> CheckpointManager:
    return CheckpointManager(str(directory), job_id, keep)


def _two_checkpoints(directory, job_id: str = JOB, series: str = server_series(), push: float = 2.0):
    """ps-000000 after worker 0's push 0, ps-000001 after its push 1; the centres after each."""
    torch.manual_seed(0)
    server = _server(nn.Linear(4, 3))
    saver = ServerCheckpoints(server, _store(directory, job_id), 60.0, series)
    centres = []
    for seq in range(2):
        versions = server.pull(worker=0).versions
        server.push(0, seq=seq, pulled_versions=versions, tensors=[torch.full((3, 4), push), torch.ones(3)])
        saver.save()
        centres.append([t.clone() for t in server.pull(worker=1).tensors])
    return centres


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(offset):
    def damage(path):
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x5A
        path.write_bytes(bytes(data))

    return damage


def _plain_safetensors(path):
    save_file({"w": torch.zeros(3)}, str(path))  # readable safetensors, not sparkdp state


def _other_sparkdp_state(path):
    state_io.save({"format": 1, "epoch": 0, "model": {"w": torch.zeros(3)}}, path)  # sparkdp, not a server's


DAMAGE = {
    "truncated": _truncate,
    "a flipped byte in the header": _flip(40),
    "a flipped byte in the tensor data": _flip(-3),
    "text": lambda p: p.write_text("not a checkpoint"),
    "plain safetensors": _plain_safetensors,
    "other sparkdp state": _other_sparkdp_state,
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_resume_skips_a_damaged_newest_checkpoint_for_the_one_before_it(tmp_path, caplog, damage):
    centres = _two_checkpoints(tmp_path)
    damage(tmp_path / NEWEST)
    model = nn.Linear(4, 3)
    server = _server(model)
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        spec = resume_server(server, _spec(model), STRATEGY, 1, _store(tmp_path))
    for got, want in zip(model.parameters(), centres[0], strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
    assert server.last_seq(0) == 0  # the older checkpoint's books, not the damaged one's
    assert spec.part.start_epoch == 0 and spec.epochs == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and NEWEST in warnings[0], warnings


def test_resume_with_every_checkpoint_damaged_is_a_clear_error(tmp_path, caplog):
    _two_checkpoints(tmp_path)
    for path in tmp_path.iterdir():
        _truncate(path)
    model = nn.Linear(4, 3)
    with (
        caplog.at_level(logging.WARNING, logger="sparkdp"),
        pytest.raises(ConfigError, match="no readable parameter-server checkpoint.*start afresh"),
    ):
        resume_server(_server(model), _spec(model), STRATEGY, 1, _store(tmp_path))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_resume_with_a_checkpoint_of_another_model_says_so(tmp_path):
    _two_checkpoints(tmp_path)
    model = nn.Linear(5, 3)
    with pytest.raises(ConfigError, match="different model or shard layout"):
        resume_server(_server(model), _spec(model), STRATEGY, 1, _store(tmp_path))


def test_a_failed_periodic_checkpoint_is_logged_and_the_next_period_saves(tmp_path, caplog, monkeypatch):
    server = _server(nn.Linear(4, 3))
    store = _store(tmp_path)
    real_put, calls, saved = store.store.put, [], threading.Event()

    def put(name, data):
        calls.append(name)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_put(name, data)
        saved.set()

    monkeypatch.setattr(store.store, "put", put)
    with caplog.at_level(logging.WARNING, logger="sparkdp"), ServerCheckpoints(server, store, 0.05):
        assert saved.wait(10), "no checkpoint was saved after the failed one"
    assert (tmp_path / f"ps-000000-{JOB}.safetensors").exists()  # the failed one's name, retried
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warnings
        and f"ps-000000-{JOB}.safetensors" in warnings[0]
        and "No space left on device" in warnings[0]
    )


# ----------------------------------------------------------- two jobs, one directory
def test_a_second_job_is_refused_where_another_jobs_server_tasks_saved(tmp_path):
    """Server task checkpoints (servers=K, ps-sKofN-...) are another job's checkpoints too."""
    refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path)))  # empty: fine
    _two_checkpoints(tmp_path, "first", server_series(0, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ps-s0of2-000000-first.safetensors",
        "ps-s0of2-000001-first.safetensors",
    ]
    with pytest.raises(ConfigError, match=r"another job \(ps-s0of2-000000-first.*resume="):
        refuse_foreign_checkpoints(JobConfig.of(checkpoint_dir=str(tmp_path)))
    job = JobConfig.of(checkpoint_dir=str(tmp_path), resume=str(tmp_path))
    assert server_lineage(job) == "first"
    refuse_foreign_checkpoints(job, server_lineage(job))  # resuming that job: its own files


def test_two_jobs_server_checkpoints_in_one_directory_are_told_apart(tmp_path):
    """Two jobs started on one empty directory save side by side: neither overwrites, rotates
    away or resumes the other's files."""
    mine = _two_checkpoints(tmp_path, "job-a", push=2.0)
    theirs = _two_checkpoints(tmp_path, "job-b", push=-3.0)
    assert mine[1][0][0, 0] != theirs[1][0][0, 0]
    for _ in range(4):  # job b saves on, keep=1: only its own older files go
        ServerCheckpoints(_server(nn.Linear(4, 3)), _store(tmp_path, "job-b", keep=1), 60.0).save()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "ps-000000-job-a.safetensors",
        "ps-000001-job-a.safetensors",
        "ps-000005-job-b.safetensors",
    ]
    for job_id, want in (("job-a", mine[1]), ("job-b", None)):
        server = _server(nn.Linear(4, 3))
        assert _store(tmp_path, job_id).load_server(server) == (
            "ps-000001-job-a.safetensors" if job_id == "job-a" else "ps-000005-job-b.safetensors"
        )
        if want is not None:
            for got, expected in zip(server.pull(worker=1).tensors, want, strict=True):
                torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="no readable parameter-server checkpoint of this job"):
        _store(tmp_path, "job-c").load_server(_server(nn.Linear(4, 3)))  # a restart before its first save


def test_a_server_checkpoint_renamed_to_another_jobs_name_is_not_loaded(tmp_path, caplog):
    _two_checkpoints(tmp_path, "job-b")
    (tmp_path / "ps-000007-job-a.safetensors").write_bytes(
        (tmp_path / "ps-000001-job-b.safetensors").read_bytes()
    )
    with caplog.at_level(logging.WARNING, logger="sparkdp"), pytest.raises(ConfigError, match="no readable"):
        _store(tmp_path, "job-a").load_server(_server(nn.Linear(4, 3)))
    assert "not what its name says" in caplog.text


def test_resuming_a_directory_of_two_jobs_servers_is_refused_unless_resume_job_names_one(tmp_path, caplog):
    """resume=DIR into a checkpoint_dir of its own, DIR holding two asynchronous jobs' server
    checkpoints (one of them servers=2's): refused with both identities, unless resume_job
    names one, which one log line then says."""
    _two_checkpoints(tmp_path, "job-a")
    _two_checkpoints(tmp_path, "job-b", server_series(1, 2))
    elsewhere = str(tmp_path / "new")
    with pytest.raises(
        ConfigError, match=r"2 jobs: job-a \(newest ps-000001-job-a.*job-b \(newest ps-s1of2-.*--resume-job"
    ):
        server_lineage(JobConfig.of(resume=str(tmp_path), checkpoint_dir=elsewhere))
    with caplog.at_level(logging.INFO, logger="sparkdp"):
        assert (
            server_lineage(JobConfig.of(resume=str(tmp_path), checkpoint_dir=elsewhere, resume_job="job-b"))
            == "job-b"
        )
    assert [r.getMessage() for r in caplog.records] == [
        f"resuming job job-b from its server checkpoints in {tmp_path}"
    ]
