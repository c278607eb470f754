"""Per-step fault tolerance on a DataFrame end to end: a frame that is not a plain Parquet scan is
written to Parquet once (removed afterwards); the one worker is SIGKILLed mid-epoch, so the quorum
cannot go on and the controller restarts it from the newest step checkpoint's cursor; a later
job resumes those checkpoints for one more epoch. Each epoch trains its row count once (the
thread tests in tests/train count row ids)."""

from __future__ import annotations

import glob
import os
import tempfile

import pytest
import torch

import sparkdp
from sparkdp.train.checkpoint import latest_checkpoint

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

ROWS, BATCH = 512, 16  # one worker: 32 steps an epoch


def _frame(spark):
    rows = [(float(i % 7) / 7, float(i % 5) / 5, int(i % 7 > 3)) for i in range(ROWS)]
    return spark.createDataFrame(rows, "a double, b double, y long")  # in memory: not a Parquet scan


def _fit(spark, epochs: int, **kw):
    torch.manual_seed(0)
    return sparkdp.fit(
        torch.nn.Linear(2, 2),
        _frame(spark),
        features=["a", "b"],
        label="y",
        workers=1,
        epochs=epochs,
        batch_size=BATCH,
        spark=spark,
        show_progress=False,
        fault_tolerance="step",
        **kw,
    )


def test_a_dataframe_job_restarts_from_its_step_checkpoint_and_resumes_later(spark, tmp_path, monkeypatch):
    copies = set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkdp-step-data-*")))
    directory = str(tmp_path / "ck")
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=0:step=40")  # epoch 2, after the save at step 37
    result = _fit(spark, 2, checkpoint_dir=directory, checkpoint_every=5)
    assert [h["samples"] for h in result.history] == [ROWS, ROWS]
    [restart] = result.details["restarts"]
    assert "epoch 2, step 5" in str(restart), restart  # the cursor: 5 steps (80 rows) into epoch 2
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "sparkdp-step-data-*"))) == copies
    saved = latest_checkpoint(directory)
    assert saved is not None and saved.quorum is not None and saved.epoch == 2  # the last epoch's end
    monkeypatch.delenv("SPARKDP_FAULT")
    more = _fit(spark, 3, resume=directory)
    assert [h["samples"] for h in more.history] == [ROWS] * 3
    assert more.history[:2] == result.history and more.details["restarts"] == []
