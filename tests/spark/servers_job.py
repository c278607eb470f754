"""A job with parameter servers on the executors, run by tests/spark/test_servers.py in a process of
its own (the test session's Spark has 2 task slots; servers and workers need more at once).

    python tests/spark/servers_job.py '{"case": "one-worker" | "killed-server" | ..., "dir": ...}'
    python tests/spark/servers_job.py '{"cases": [{"case": ..., "dir": ...}, ...]}'

Prints one JSON line: what the test checks (with "cases": a list, one entry per case, run in
order on one Spark session, which saves a JVM start per case)."""

import json
import logging
import sys

import torch
from torch import nn

import sparkdp
from sparkdp.data.tensors import TensorData


def _problem(rows):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 4, generator=g)
    y = (x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) > 0).long()
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2)), x, y


def one_worker(spark, args):
    """1 worker, push and pull every batch, 2 servers: server SGD(lr) == torch SGD on the same batches."""
    model, x, y = _problem(64)
    reference, _, _ = _problem(64)
    opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    order = TensorData(x, y).shard_indices(rank=0, world_size=1, epoch=0, seed=0, shuffle=True)
    for start in range(0, 64, 8):
        idx = order[start : start + 8]
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
        opt.step()
    result = sparkdp.fit(
        model,
        (x, y),
        strategy="asgd",
        strategy_options={"servers": 2, "rule_options": {"lr": 0.3}},
        optimizer="sgd",
        optimizer_options={"lr": 0.05, "momentum": 0.0},
        workers=1,
        epochs=1,
        batch_size=8,
        spark=spark,
        show_progress=False,
        run_dir=args["dir"],
        metrics_interval_s=0.2,
    )
    error = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))
    return {
        "max_error": error,
        "servers": result.details["servers"],
        "server": result.details["server"],
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }


def _fit_two_servers(spark, **job):
    """The 512-row problem with asgd on 2 executor servers and 2 workers; ``job``: what differs."""
    model, x, y = _problem(512)
    settings = {"workers": 2, "epochs": 4, **job}
    return sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        strategy="asgd",
        strategy_options={"servers": 2, "rule_options": {"lr": 0.1}},
        optimizer="sgd",
        optimizer_options={"lr": 0.1, "momentum": 0.0},
        batch_size=16,
        spark=spark,
        show_progress=False,
        **settings,
    )


def killed_server(spark, args):
    result = _fit_two_servers(spark, checkpoint_dir=args["dir"], checkpoint_every_s=0.1)
    return {
        "accuracy": result.test_accuracy,
        "restarts": result.details["restarts"],
        "servers": [{k: v for k, v in s.items() if k != "staleness"} for s in result.details["servers"]],
    }


def shrunk(spark, args):
    """A worker killed with two servers on the executors, min_workers=1 and (as Spark would say
    after losing an executor) 3 task slots left: the stage restarts with the two servers and
    one worker, from the servers' newest checkpoints."""
    from sparkdp.spark import cluster

    cluster.available_slots = lambda _spark: 3
    result = _fit_two_servers(
        spark, min_workers=1, epochs=3, checkpoint_dir=args["dir"], checkpoint_every_s=0.1
    )
    return {
        "accuracy": result.test_accuracy,
        "restarts": result.details["restarts"],
        "workers": result.workers,
    }


def driver_shrunk(spark, args):
    """A worker killed with the server on the driver, min_workers=1 and (as Spark would say after
    losing an executor) 1 task slot left: the tasks restart on one worker from the server's
    current centre."""
    from sparkdp.spark import cluster

    cluster.available_slots = lambda _spark: 1
    model, x, y = _problem(512)
    result = sparkdp.fit(
        model,
        (x, y),
        eval_data=(x, y),
        strategy="asgd",
        strategy_options={"rule_options": {"lr": 0.1}},
        optimizer="sgd",
        optimizer_options={"lr": 0.1, "momentum": 0.0},
        batch_size=16,
        spark=spark,
        show_progress=False,
        workers=2,
        epochs=3,
        min_workers=1,
    )
    return {
        "accuracy": result.test_accuracy,
        "restarts": result.details["restarts"],
        "preemptions": result.details["preemptions"],
        "workers": result.workers,
    }


def resumed(spark, args):
    """The killed-server job's checkpoints resumed: every epoch is covered, so nothing trains and
    the model is the saved centre."""
    result = _fit_two_servers(spark, resume=args["dir"])
    return {"accuracy": result.test_accuracy, "samples": result.samples}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    args = json.loads(sys.argv[1])
    cases = {
        "one-worker": one_worker,
        "killed-server": killed_server,
        "resumed": resumed,
        "shrunk": shrunk,
        "driver-shrunk": driver_shrunk,
    }
    session = sparkdp.session("local[4]", app_name="sparkdp-servers-test")
    try:
        if "cases" in args:
            out = [cases[case["case"]](session, case) for case in args["cases"]]
        else:
            out = cases[args["case"]](session, args)
    finally:
        session.stop()
    print(json.dumps(out))
