"""The async worker at world size 1, through the in-process transport: what it pushes, per rule.

References are plain ``torch.optim.SGD`` runs on the same batches.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from sparkdp.comm import IndependentCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.ps import ParameterServer
from sparkdp.ps.transport.inproc import InProcTransport
from sparkdp.rules import RULES, PushKind
from sparkdp.strategies import AsyncParameterServer
from sparkdp.strategies.async_ps import AsyncWorker
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss

pytestmark = pytest.mark.timeout(60)


def _batches(n: int, rows: int = 8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 4, generator=g), torch.randint(0, 3, (rows,), generator=g)) for _ in range(n)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _run_one_worker(strategy: AsyncParameterServer, worker_opt, batches) -> list[torch.Tensor]:
    """Train one worker through the in-process transport; return the server's centre."""
    model = _model()
    spec = strategy.rule_spec(1)
    server = ParameterServer(lambda shard: spec.create(), list(model.parameters()))
    transport = InProcTransport(use_codec=True)
    with transport.serve(server) as endpoint:
        client = transport.connect(endpoint.info.address, endpoint.info.secret, 0)
        local = copy.deepcopy(model)
        opt = worker_opt(local.parameters())
        runner = AsyncWorker(strategy, client, local, opt, num_workers=1)
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(local(x), y).backward()
            opt.step()
            runner.after_step(len(x))
        runner.finish()
        return server.pull(worker=1).tensors


def _torch_reference(make_opt, batches, group: int = 1) -> list[torch.Tensor]:
    """torch SGD where each step sees the mean gradient of ``group`` consecutive batches."""
    model = _model()
    opt = make_opt(model.parameters())
    for start in range(0, len(batches), group):
        opt.zero_grad()
        chunk = batches[start : start + group]
        for x, y in chunk:
            (nn.functional.cross_entropy(model(x), y) / len(chunk)).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _assert_close(got, expected, what):
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), (
            f"{what}: tensor {i} differs by {(a - b).abs().max():.3g}"
        )


def test_rules_declare_what_their_workers_push():
    kinds = {name: RULES.create(name, num_workers=2).pushes for name in RULES.available()}
    assert kinds["ddcasgd"] is PushKind.GRADIENT
    assert kinds["easgd"] is kinds["easgd-deepspark"] is PushKind.ELASTIC
    assert {kinds[n] for n in ("asgd", "hogwild", "dcasgd", "sa-asgd", "dynsgd")} == {
        PushKind.PSEUDO_GRADIENT
    }


@pytest.mark.parametrize("worker_momentum", [0.0, 0.9])
def test_one_ddcasgd_worker_is_torch_momentum_sgd_whatever_the_worker_optimizer(worker_momentum):
    """DDC-ASGD's reduction M = 1 -> SGD(lr, momentum) holds end to end: the server owns the momentum,
    so a momentum worker must not add its own (two momenta compound and training diverges)."""
    batches = _batches(12)
    strategy = AsyncParameterServer("ddcasgd", {"lr": 0.1, "momentum": 0.9})
    got = _run_one_worker(
        strategy, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=worker_momentum), batches
    )
    expected = _torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), batches)
    _assert_close(got, expected, f"DDC-ASGD (worker momentum {worker_momentum}) vs torch SGD(0.1, 0.9)")


def test_a_gradient_push_every_k_steps_is_the_mean_of_the_k_gradients():
    """Worker lr 0: all k gradients are taken at the pulled centre, so a push of their mean is one
    server step on the union of the k batches."""
    batches = _batches(12)
    strategy = AsyncParameterServer("ddcasgd", {"lr": 0.1, "momentum": 0.5}, push_every=3)
    got = _run_one_worker(strategy, lambda ps: torch.optim.SGD(ps, lr=0.0), batches)
    expected = _torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5), batches, group=3)
    _assert_close(got, expected, "DDC-ASGD k=3 vs torch SGD on 3-batch means")


def test_one_asgd_worker_through_the_in_process_transport_is_torch_sgd():
    """A plain SGD worker's pseudo-gradient is its gradient: server SGD(lr) on it == torch SGD(lr)."""
    batches = _batches(10)
    strategy = AsyncParameterServer("asgd", {"lr": 0.2})
    got = _run_one_worker(strategy, lambda ps: torch.optim.SGD(ps, lr=0.05), batches)
    _assert_close(got, _torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.2), batches), "ASGD vs torch SGD")


def test_the_task_loop_at_world_size_one_through_the_in_process_transport_is_torch_sgd():
    """``fit_worker`` -- the loop every Spark task runs -- with the async strategy connected in process."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    data = TensorData(x, y)
    model = _model()
    strategy = AsyncParameterServer("asgd", {"lr": 0.3})
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.05, momentum=0.0),
        strategy=strategy,
        train=data,
        eval=None,
        training=TrainingConfig(epochs=2, batch_size=8),
    )
    rule = strategy.rule_spec(1)
    server = ParameterServer(lambda shard: rule.create(), list(model.parameters()))
    transport = InProcTransport(use_codec=True)
    with transport.serve(server) as endpoint:
        report = fit_worker(
            replace(spec, strategy=strategy.connect_to(transport, endpoint.info)), IndependentCollective(0, 1)
        )
    batches = [
        (x[idx], y[idx])
        for epoch in range(2)
        for order in [data.shard_indices(rank=0, world_size=1, epoch=epoch, seed=0, shuffle=True)]
        for idx in order.split(8)
    ]
    _assert_close(
        server.pull(worker=1).tensors,
        _torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.3), batches),
        "fit_worker (async) through InProcTransport vs torch SGD",
    )
    assert report.strategy_metrics["pushes"] == 16 and server.metrics()["staleness"] == {0: 16}
    assert report.state == b""  # the trained parameters are the server's


def test_worker_zero_evaluates_the_centre_every_eval_every_epochs_without_moving_its_bookkeeping():
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
    model = _model()
    strategy = AsyncParameterServer("dcasgd", {"lr": 0.1})
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.05, momentum=0.0),
        strategy=strategy,
        train=TensorData(x, y),
        eval=TensorData(x, y),
        training=TrainingConfig(epochs=5, batch_size=8, eval_every=2),
    )
    rule = strategy.rule_spec(1)
    server = ParameterServer(lambda shard: rule.create(), list(model.parameters()))
    connected = []

    class CountingTransport(InProcTransport):
        def connect(self, address, secret, worker_id, **kw):
            connected.append(worker_id)
            return super().connect(address, secret, worker_id, **kw)

    transport = CountingTransport(use_codec=True)
    with transport.serve(server) as endpoint:
        report = fit_worker(
            replace(spec, strategy=strategy.connect_to(transport, endpoint.info)), IndependentCollective(0, 1)
        )
    # epochs 2 and 4 (1-based) by worker 0; the last one is the driver's, after every worker is done
    assert ["test_accuracy" in h for h in report.history] == [False, True, False, True, False]
    # over the worker's own connection: a second one could be refused while the server is busy
    assert connected == [0]
    assert 0.0 <= report.history[1]["test_accuracy"] <= 1.0
    # the observer's pulls left worker 0 fresh: one worker never sees a stale push
    assert server.metrics()["staleness"] == {0: 20}
