"""The driver's parameter-server checkpoints: resume skips damaged files, a failed periodic save
does not end periodic saving. No Spark: the server, the saver and the resume step directly."""

from __future__ import annotations

import errno
import logging
import threading

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from sparkdp import state as state_io
from sparkdp.data.tensors import TensorData
from sparkdp.driver.async_job import ServerCheckpoints, _resume_server, server_factory
from sparkdp.errors import ConfigError
from sparkdp.strategies import AsyncParameterServer
from sparkdp.train.loop import FitSpec
from sparkdp.train.optim import optimizer_factory, resolve_loss

pytestmark = pytest.mark.timeout(60)

STRATEGY = AsyncParameterServer("asgd", {"lr": 1.0})


def _spec(model: nn.Module) -> FitSpec:
    x, y = torch.zeros(16, 4), torch.zeros(16, dtype=torch.long)
    return FitSpec(model=model, loss=resolve_loss("cross_entropy"),
                   optimizer=optimizer_factory("sgd", model, lr=0.1), strategy=STRATEGY,
                   train=TensorData(x, y), eval=None, epochs=3, batch_size=8)


def _server(model: nn.Module):
    return server_factory(STRATEGY, 1)(list(model.parameters()))


def _two_checkpoints(directory):
    """ps-000000 after worker 0's push 0, ps-000001 after its push 1; the centres after each."""
    torch.manual_seed(0)
    server = _server(nn.Linear(4, 3))
    centres = []
    for seq in range(2):
        versions = server.pull(worker=0).versions
        server.push(0, seq=seq, pulled_versions=versions, tensors=[torch.full((3, 4), 2.0), torch.ones(3)])
        server.save(directory / f"ps-{seq:06d}.safetensors")
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


DAMAGE = {"truncated": _truncate, "a flipped byte in the header": _flip(40),
          "a flipped byte in the tensor data": _flip(-3), "text": lambda p: p.write_text("not a checkpoint"),
          "plain safetensors": _plain_safetensors, "other sparkdp state": _other_sparkdp_state}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_resume_skips_a_damaged_newest_checkpoint_for_the_one_before_it(tmp_path, caplog, damage):
    centres = _two_checkpoints(tmp_path)
    damage(tmp_path / "ps-000001.safetensors")
    model = nn.Linear(4, 3)
    server = _server(model)
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        spec = _resume_server(server, _spec(model), STRATEGY, 1, str(tmp_path))
    for got, want in zip(model.parameters(), centres[0], strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
    assert server.last_seq(0) == 0  # the older checkpoint's books, not the damaged one's
    assert spec.part.start_epoch == 0 and spec.epochs == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ps-000001.safetensors" in warnings[0], warnings


def test_resume_with_every_checkpoint_damaged_is_a_clear_error(tmp_path, caplog):
    _two_checkpoints(tmp_path)
    for path in tmp_path.iterdir():
        _truncate(path)
    model = nn.Linear(4, 3)
    with caplog.at_level(logging.WARNING, logger="sparkdp"), \
            pytest.raises(ConfigError, match="no readable parameter-server checkpoint.*start afresh"):
        _resume_server(_server(model), _spec(model), STRATEGY, 1, str(tmp_path))
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_resume_with_a_checkpoint_of_another_model_says_so(tmp_path):
    _two_checkpoints(tmp_path)
    model = nn.Linear(5, 3)
    with pytest.raises(ConfigError, match="different model or shard layout"):
        _resume_server(_server(model), _spec(model), STRATEGY, 1, str(tmp_path))


def test_a_checkpoint_without_a_digest_still_loads(tmp_path):
    """Checkpoints saved before the SHA-256 was added are read unverified."""
    centres = _two_checkpoints(tmp_path)
    torch.manual_seed(0)
    source = _server(nn.Linear(4, 3))
    source.load(tmp_path / "ps-000001.safetensors")
    state_io.save(source.state_dict(), tmp_path / "ps-000001.safetensors")
    fresh = _server(nn.Linear(4, 3))
    fresh.load(tmp_path / "ps-000001.safetensors")
    for got, want in zip(fresh.pull(worker=1).tensors, centres[1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_failed_periodic_checkpoint_is_logged_and_the_next_period_saves(tmp_path, caplog, monkeypatch):
    server = _server(nn.Linear(4, 3))
    real_save, calls, saved = server.save, [], threading.Event()

    def save(path):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(path)
        saved.set()

    monkeypatch.setattr(server, "save", save)
    with caplog.at_level(logging.WARNING, logger="sparkdp"), ServerCheckpoints(server, str(tmp_path), 0.05, 3):
        assert saved.wait(10), "no checkpoint was saved after the failed one"
    assert (tmp_path / "ps-000000.safetensors").exists()  # the failed one's name, retried
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "ps-000000.safetensors" in warnings[0] and "No space left on device" in warnings[0]
