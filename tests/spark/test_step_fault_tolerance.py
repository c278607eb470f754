"""Per-step fault tolerance end to end (``fault_tolerance="step"``): the busiest worker SIGKILLed
mid-run (injected with SPARKDP_FAULT), the other keeps training without a restart, and Spark's
task retry (the session is ``local[2,4]``) joins as a replacement healed from it.

The jobs run enough steps after each fault (4 or 8 epochs of 24 steps) that the replacement
arrives before the survivor has trained to the end, also on a loaded machine: a job that ends
first is correct, but would leave the join these tests check unseen."""

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
    return dataset_tensors(load_dataset("fashion-mnist", limit=3000))


EPOCHS = 4


def _fit(spark, data, epochs=EPOCHS, **kw):
    train, test = data
    torch.manual_seed(0)
    return sparkdp.fit(
        build_model("cnn-small"),
        train,
        eval_data=test,
        workers=2,
        epochs=epochs,
        batch_size=64,
        spark=spark,
        memory_format="contiguous",
        show_progress=False,
        fault_tolerance="step",
        **kw,
    )


@pytest.fixture(scope="module")
def undisturbed(spark, fashion):
    return _fit(spark, fashion)


def test_a_job_without_failures_trains_every_row_once_per_epoch(undisturbed, fashion):
    rows = len(fashion[0].features)
    assert [h["samples"] for h in undisturbed.history] == [rows] * EPOCHS
    assert undisturbed.details["restarts"] == [] and undisturbed.details["membership"] == []
    assert undisturbed.test_accuracy > 0.5


def test_the_busiest_worker_killed_mid_run_costs_no_restart(spark, fashion, undisturbed, monkeypatch, caplog):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=0:step=30")  # 24 steps an epoch: in epoch 2 of 4
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion)
    assert result.details["restarts"] == []
    kinds = [(m["worker"], m["kind"]) for m in result.details["membership"]]
    assert kinds == [(0, "leave"), (0, "join")], result.details["membership"]
    leave, join = result.details["membership"]
    assert (
        join["healed_from"] == 1
        and join["bytes"] > 0
        and join["heal_s"] >= 0
        and join["step"] >= leave["step"]
    )
    lines = [r.getMessage() for r in caplog.records if "the quorum" in r.getMessage()]
    assert len(lines) == 2 and "left the quorum" in lines[0] and "joined the quorum" in lines[1], lines
    assert [h["samples"] for h in result.history] == [h["samples"] for h in undisturbed.history]
    assert abs(result.test_accuracy - undisturbed.test_accuracy) <= 0.015
    assert result.summary()["membership"] == result.details["membership"]


def test_a_stopped_worker_is_dropped_by_its_heartbeat_and_its_task_replaced(
    spark, fashion, monkeypatch, caplog
):
    monkeypatch.setenv(
        "SPARKDP_FAULT", "stop:rank=1:step=10"
    )  # SIGSTOP: alive, silent, never retried by Spark
    with caplog.at_level(logging.WARNING, logger="sparkdp"):
        result = _fit(spark, fashion, epochs=8, pg_timeout_s=10)  # the stop is found after 5 s
    leave, join = result.details["membership"]
    assert (leave["worker"], leave["kind"], join["worker"], join["kind"]) == (1, "leave", 1, "join")
    assert "no heartbeat for 5 s" in leave["cause"] and result.details["restarts"] == []
    assert any("worker 1's task ended" in r.getMessage() for r in caplog.records)
    rows = len(fashion[0].features)
    assert [h["samples"] for h in result.history] == [rows] * 8


def test_a_diloco_worker_killed_mid_round_costs_the_round_only(spark, fashion, monkeypatch, caplog):
    monkeypatch.setenv("SPARKDP_FAULT", "kill:rank=0:step=4")  # rounds of 5 steps: 5 an epoch
    result = _fit(spark, fashion, strategy="diloco", strategy_options={"period": 5})
    assert result.details["restarts"] == [] and result.strategy == "diloco"
    kinds = [(m["worker"], m["kind"]) for m in result.details["membership"]]
    assert kinds == [(0, "leave"), (0, "join")], result.details["membership"]
    rows = len(fashion[0].features)
    assert [h["samples"] for h in result.history] == [rows] * EPOCHS
