"""Every registered update rule, with its defaults, trains the built-in CNN.

The rules' algebra is checked against references in tests/rules; this checks that each
one *learns*: two workers run the Spark task loop (``fit_worker``) in threads
against the real parameter server over authenticated TCP on 127.0.0.1, with the CLI's
default worker optimizer (SGD, lr 0.05, momentum 0.9) and every rule hyper-parameter
at its default, on real Fashion-MNIST rows. DDC-ASGD stayed at chance this way before
workers pushed it raw gradients.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import replace

import pytest
import torch

from sparkdp.comm import IndependentCollective, SingleProcessCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model
from sparkdp.ps import ParameterServer
from sparkdp.ps.transport import TcpOptions, TcpTransport
from sparkdp.rules import RULES
from sparkdp.strategies import AsyncParameterServer
from sparkdp.train.loop import FitSpec, evaluate, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss

pytestmark = pytest.mark.timeout(240)

WORKERS = 2
TRAIN_ROWS = 16000  # 250 pushes in all at batch 64
TEST_ROWS = 2000


@pytest.fixture(scope="module")
def data():
    ds = load_dataset("fashion-mnist", limit=TRAIN_ROWS)
    train, test = dataset_tensors(ds)
    test.features, test.labels = test.features[:TEST_ROWS], test.labels[:TEST_ROWS]
    return train, test


def _train(rule: str, data) -> float:
    """Accuracy of the server's centre after one epoch of ``rule`` on two worker threads."""
    train, test = data
    torch.manual_seed(0)
    model = build_model("cnn-small")
    strategy = AsyncParameterServer(rule)
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.05, momentum=0.9),
        strategy=strategy,
        train=train,
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=64, memory_format="contiguous"),
        prefetch=0,
    )
    rule_spec = strategy.rule_spec(WORKERS)
    server = ParameterServer(lambda shard: rule_spec.create(), list(model.parameters()))
    errors: list[BaseException] = []
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # one per worker, as a Spark task on one core gets
    transport = TcpTransport(TcpOptions())
    with transport.serve(server, host="127.0.0.1") as endpoint:

        def worker(m: int) -> None:
            try:  # each task gets its own copy of the model, as Spark's deserialisation gives it
                own = replace(
                    _own_copy(spec), strategy=copy.copy(strategy).connect_to(transport, endpoint.info)
                )
                fit_worker(own, IndependentCollective(m, WORKERS))
            except BaseException as exc:  # surfaced below, with the rule's name
                errors.append(exc)

        threads = [
            threading.Thread(target=worker, args=(m,), name=f"test-worker-{m}") for m in range(WORKERS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        assert not any(t.is_alive() for t in threads), f"{rule}: a worker thread hung"
    torch.set_num_threads(threads_before)
    assert not errors, f"{rule}: a worker failed: {errors[0]!r}"
    metrics = server.metrics()
    assert metrics["pushes_applied"] == WORKERS * math.ceil(TRAIN_ROWS / WORKERS / 64), metrics
    with torch.no_grad():
        for p, c in zip(model.parameters(), server.pull(worker=WORKERS).tensors):
            p.copy_(c)
    return evaluate(model, spec.loss, test, SingleProcessCollective(), 256)["test_accuracy"]


def _own_copy(spec: FitSpec) -> FitSpec:
    clone = copy.copy(spec)
    clone.model = copy.deepcopy(spec.model)
    return clone


@pytest.fixture(scope="module")
def asgd_accuracy(data) -> float:
    return _train("asgd", data)


def _configuration(name: str) -> tuple:
    """What a registered name builds: aliases (sa-asgd / ssgd-aware, dcasgd / dcasgd-a) build the same."""
    rule = RULES.create(name, num_workers=WORKERS)
    return type(rule), tuple(sorted((k, repr(v)) for k, v in vars(rule).items() if not k.startswith("_")))


DISTINCT_RULES = sorted({_configuration(n): n for n in reversed(RULES.available())}.values())


def test_the_distinct_rules_cover_every_registered_name():
    assert {_configuration(n) for n in RULES.available()} == {_configuration(n) for n in DISTINCT_RULES}
    assert len(DISTINCT_RULES) >= 9


@pytest.mark.parametrize("rule", DISTINCT_RULES)
def test_every_rule_with_its_defaults_trains_the_builtin_cnn(rule, data, asgd_accuracy):
    accuracy = asgd_accuracy if rule == "asgd" else _train(rule, data)
    # Chance is 0.10 (DDC-ASGD with worker momentum stayed there); asgd reaches 0.70-0.73 here and
    # the others 0.63-0.80 over repeated runs: asynchronous runs are not deterministic, and dynsgd
    # and sa-asgd halve the step at staleness 1 by design.
    assert accuracy > 0.55, f"{rule}: test accuracy {accuracy:.3f} after one epoch (chance 0.10)"
    assert accuracy > asgd_accuracy - 0.2, f"{rule}: {accuracy:.3f} against asgd's {asgd_accuracy:.3f}"
