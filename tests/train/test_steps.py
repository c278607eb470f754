"""fit's optimizer step beyond the plain one: accumulation, clipping, a named lr schedule and
mixed precision, each against an independent reference (a single process on the big batch,
torch.nn.utils.clip_grad_norm_, hand-worked numbers)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparkdp import state as state_io
from sparkdp.comm.single import SingleProcessCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.errors import ConfigError
from sparkdp.strategies import resolve_strategy
from sparkdp.train.loop import FitSpec, fit_worker, optimizer_state_to_bytes
from sparkdp.train.optim import optimizer_factory, resolve_loss
from sparkdp.train.precision import resolve_precision
from sparkdp.train.schedule import WarmupCosine, lr_schedule
from sparkdp.train.step import with_last

pytestmark = pytest.mark.timeout(60)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _data(rows: int = 48) -> TensorData:
    g = torch.Generator().manual_seed(1)
    return TensorData(torch.randn(rows, 5, generator=g), torch.randint(0, 3, (rows,), generator=g))


def _spec(model: nn.Module, data: TensorData, **settings) -> FitSpec:
    """A spec of ``model`` on ``data``; ``settings``: TrainingConfig's (epochs 2, batch_size 8 unless given)."""
    opt = settings.pop("optimizer", None) or optimizer_factory("sgd", model, lr=0.1, momentum=0.9)
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=opt,
        strategy=resolve_strategy("allreduce"),
        train=data,
        eval=None,
        training=TrainingConfig(**{"epochs": 2, "batch_size": 8, **settings}),
    )


def _params(report) -> list[torch.Tensor]:
    """The trained parameters in name order."""
    state = state_io.state_from_bytes(report.state)
    return [state[k] for k in sorted(state)]


def _close(got, want, what):
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-5), f"{what}: differs by {(g - w).abs().max()}"


def test_accumulating_two_batches_of_b_equals_one_batch_of_2b():
    data = _data(48)
    big = fit_worker(_spec(_model(), data, batch_size=8), SingleProcessCollective())
    small = fit_worker(_spec(_model(), data, batch_size=4, accumulate=2), SingleProcessCollective())
    assert small is not None and big is not None
    _close(_params(small), _params(big), "accumulate=2 x 4 rows vs 8 rows")
    plain = fit_worker(_spec(_model(), data, batch_size=4), SingleProcessCollective())
    assert any(not torch.allclose(a, b, atol=1e-4) for a, b in zip(_params(plain), _params(big)))


def test_a_short_last_group_steps_on_its_own_mean_gradient():
    # 20 rows, batches of 4: 5 micro-batches an epoch, accumulate 2 -> groups of 2, 2, 1;
    # the reference: batches of 8 (the last one 4 rows), one step each
    data = _data(20)
    big = fit_worker(_spec(_model(), data, batch_size=8, epochs=1, shuffle=False), SingleProcessCollective())
    small = fit_worker(
        _spec(_model(), data, batch_size=4, epochs=1, shuffle=False, accumulate=2), SingleProcessCollective()
    )
    _close(_params(small), _params(big), "groups 2, 2, 1 vs batches 8, 8, 4")


def test_clip_grad_norm_equals_torch_clip_grad_norm_on_a_single_process_reference():
    data = _data(32)
    model = _model()
    spec = _spec(
        model,
        data,
        batch_size=8,
        epochs=1,
        shuffle=False,
        clip_grad_norm=0.05,
        optimizer=optimizer_factory("sgd", model, lr=0.5, momentum=0.0),
    )
    got = _params(fit_worker(spec, SingleProcessCollective()))
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    norms = []
    for x, y in zip(data.features.split(8), data.labels.split(8)):
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)))
        opt.step()
    assert max(norms) > 0.05  # the clipping did act
    _close(got, [v for _, v in sorted(ref.state_dict().items())], "clip_grad_norm vs torch's")


def test_warmup_cosine_hand_worked():
    f = WarmupCosine(warmup_steps=2, total_steps=6, min_lr_ratio=0.1)
    # warmup (k+1)/3; then 0.1 + 0.9 (1 + cos(pi (k-2)/3)) / 2
    assert [round(f(k), 6) for k in range(6)] == [0.333333, 0.666667, 1.0, 0.775, 0.325, 0.1]


def test_the_schedule_steps_per_optimizer_step_and_survives_its_state_round_trip():
    data = _data(32)  # 8 rows a step: 4 optimizer steps a epoch, 2 epochs -> 8 steps
    model = _model()
    lrs: list[float] = []
    opt = optimizer_factory(lambda ps: _Recording(ps, lrs), model)
    schedule = {"lr_schedule": "warmup-cosine", "warmup_steps": 3, "min_lr_ratio": 0.0}
    spec = _spec(model, data, batch_size=4, accumulate=2, optimizer=opt, **schedule)
    fit_worker(spec, SingleProcessCollective())
    want = [WarmupCosine(3, 8, 0.0)(k) for k in range(8)]
    assert lrs == pytest.approx(want)
    # a checkpoint's optimizer state carries the schedule's position
    sgd = torch.optim.SGD(_model().parameters(), lr=1.0)
    sched = lr_schedule(spec.training, sgd, 8)
    for _ in range(5):
        sgd.step()
        sched.step()
    again = torch.optim.SGD(_model().parameters(), lr=1.0)
    resumed = lr_schedule(spec.training, again, 8)
    saved = state_io.from_bytes(optimizer_state_to_bytes(sgd, sched))
    again.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved["scheduler"])
    assert again.param_groups[0]["lr"] == pytest.approx(want[5]) and resumed.last_epoch == 5


class _Recording(torch.optim.SGD):
    def __init__(self, params, lrs: list[float]) -> None:
        super().__init__(params, lr=1.0)
        self.lrs = lrs

    def step(self, closure=None):  # noqa: ANN001, ANN201
        self.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_bf16_mixed_runs_the_forward_in_bfloat16_and_trains():
    from sparkdp.data.tensors import DictData
    from tests.train.lm_models import TinyCausalLM, token_data

    model = TinyCausalLM()
    before = [p.detach().clone() for p in model.parameters()]
    spec = FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("adam", model, lr=0.05),
        strategy=resolve_strategy("allreduce"),
        train=DictData(token_data(32)),
        eval=None,
        training=TrainingConfig(epochs=3, batch_size=8, precision="bf16-mixed"),
    )
    report = fit_worker(spec, SingleProcessCollective())
    assert model.seen_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert report.history[-1]["loss"] < report.history[0]["loss"]
    assert any(not torch.equal(a, b) for a, b in zip(before, _params(report)))


def test_the_default_precision_adds_no_autocast():
    from sparkdp.data.tensors import DictData
    from tests.train.lm_models import TinyCausalLM, token_data

    model = TinyCausalLM()
    spec = FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("sgd", model),
        strategy=resolve_strategy("allreduce"),
        train=DictData(token_data(16)),
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=8),
    )
    fit_worker(spec, SingleProcessCollective())
    assert model.seen_dtype == torch.float32


def test_fp16_mixed_is_refused_on_cpu_with_what_to_do():
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*bf16-mixed"):
        resolve_precision("fp16-mixed", "cpu")
    assert (
        resolve_precision("32", "cpu").scaler() is None
        and resolve_precision("bf16-mixed", "cpu").dtype == torch.bfloat16
    )


@pytest.mark.parametrize("name", ["average", "diloco"])
def test_step_counting_strategies_count_optimizer_steps_not_micro_batches(name):
    data = _data(32)  # batches of 4: 8 micro-batches an epoch, accumulate 2 -> 4 optimizer steps
    strategy = resolve_strategy(name, period=3)
    spec = replace(_spec(_model(), data, batch_size=4, accumulate=2, epochs=1), strategy=strategy)
    fit_worker(spec, SingleProcessCollective())
    assert strategy.state_dict()["steps"] == 4


def test_with_last_marks_only_the_last_item():
    assert list(with_last(iter([1, 2, 3]))) == [(1, False), (2, False), (3, True)]
    assert list(with_last(iter([]))) == []


def test_new_settings_are_checked_with_what_is_allowed():
    from sparkdp.config import JobConfig

    with pytest.raises(ConfigError, match="precision must be one of 32, bf16-mixed, fp16-mixed"):
        JobConfig.of(precision="16")
    with pytest.raises(ConfigError, match="accumulate must be a positive integer"):
        JobConfig.of(accumulate=0)
    with pytest.raises(ConfigError, match="clip_grad_norm must be a number > 0"):
        JobConfig.of(clip_grad_norm=-1.0)
    with pytest.raises(ConfigError, match="lr_schedule must be one of constant, warmup-cosine"):
        JobConfig.of(lr_schedule="cosine")
    with pytest.raises(
        ConfigError,
        match=r"checkpoint_every \(6\) counts batches and must be a multiple of "
        r"accumulate \(4\).*checkpoint_every=4",
    ):
        JobConfig.of(accumulate=4, checkpoint_every=6)
    job = JobConfig.of(
        precision="bf16-mixed",
        accumulate=4,
        clip_grad_norm=1.0,
        lr_schedule="warmup-cosine",
        warmup_steps=10,
        min_lr_ratio=0.1,
    )
    assert job.training.accumulate == 4 and math.isclose(job.training.min_lr_ratio, 0.1)


def test_an_asynchronous_worker_pushes_per_optimizer_step_not_per_micro_batch():
    from sparkdp.comm import IndependentCollective
    from sparkdp.ps import ParameterServer
    from sparkdp.ps.transport.inproc import InProcTransport
    from sparkdp.strategies import AsyncParameterServer

    data = _data(32)  # batches of 4: 8 micro-batches an epoch, accumulate 2 -> 4 optimizer steps
    model = _model()
    strategy = AsyncParameterServer("asgd", {"lr": 0.1})
    spec = replace(_spec(model, data, batch_size=4, accumulate=2), strategy=strategy)
    rule = strategy.rule_spec(1)
    server = ParameterServer(lambda shard: rule.create(), list(model.parameters()))
    transport = InProcTransport(use_codec=True)
    with transport.serve(server) as endpoint:
        report = fit_worker(
            replace(spec, strategy=strategy.connect_to(transport, endpoint.info)), IndependentCollective(0, 1)
        )
    assert report.strategy_metrics["pushes"] == 2 * 4  # 2 epochs x 4 optimizer steps (push_every 1)
