"""Run by tests/spark/test_step_hsdp.py in a process of its own: hsdp's per-step fault tolerance
needs 4 task slots (2 replica groups of 2 shards), the shared test session has 2. Prints one JSON
line: the undisturbed and the disturbed run's figures."""

from __future__ import annotations

import json
import logging
import os

import torch

import sparkdp
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model


def _fit(spark, data) -> dict:
    train, test = data
    torch.manual_seed(0)
    result = sparkdp.fit(
        build_model("cnn-small"),
        train,
        eval_data=test,
        workers=4,
        epochs=4,
        batch_size=32,
        spark=spark,
        memory_format="contiguous",
        show_progress=False,
        fault_tolerance="step",
        strategy="hsdp",
        strategy_options={"shard_size": 2},
    )
    return {
        "membership": result.details["membership"],
        "restarts": result.details["restarts"],
        "samples": [h["samples"] for h in result.history],
        "accuracy": result.test_accuracy,
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    fault = os.environ.pop("SPARKDP_FAULT")  # for the second run only
    data = dataset_tensors(load_dataset("fashion-mnist", limit=3000))
    session = sparkdp.session("local[4,4]", app_name="sparkdp-step-hsdp-test")
    try:
        undisturbed = _fit(session, data)
        os.environ["SPARKDP_FAULT"] = fault
        disturbed = _fit(session, data)
    finally:
        session.stop()
    print(json.dumps({"undisturbed": undisturbed, "disturbed": disturbed}))
