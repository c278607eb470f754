"""A worker process killed mid-epoch (SIGKILL, injected with SPARKDP_FAULT): the driver restarts
the barrier stage from the latest checkpoint and the job ends where an uninterrupted one does."""

from __future__ import annotations

import logging

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
    return sparkdp.fit(model, train, eval_data=test, workers=2, epochs=2, batch_size=64, spark=spark,
                       memory_format="contiguous", show_progress=False, **kw)


def _same_weights(a, b) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], rtol=0, atol=0)


@pytest.fixture(scope="module")
def uninterrupted(spark, fashion):
    return _fit(spark, fashion)


def test_killed_worker_restarts_from_the_latest_checkpoint(spark, fashion, uninterrupted, tmp_path, monkeypatch,
                                                           caplog):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=1:step=30")  # 47 steps per epoch
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion, checkpoint_dir=str(tmp_path), checkpoint_every=20)
    restarts = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert len(restarts) == 1
    assert "worker 1 died" in restarts[0] and "restart 1 of 3 from epoch 1, step 20" in restarts[0]
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
