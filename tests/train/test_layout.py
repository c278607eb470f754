"""Channels-last training (train.layout): same result as NCHW PyTorch, only the strides differ."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sparkdp.comm import SingleProcessCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.errors import ConfigError
from sparkdp.strategies import resolve_strategy
from sparkdp.train.layout import has_conv2d, preflight_layout, use_channels_last
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory

pytestmark = pytest.mark.timeout(120)


def small_cnn() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    )


class ViewsActivations(nn.Module):
    """A model written the common way that channels-last breaks: ``view`` on a conv output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 8 * 8, 3)

    def forward(self, x):
        h = self.conv(x)
        return self.fc(h.view(h.size(0), -1))


def test_auto_means_conv_models_on_cpu_only():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert has_conv2d(small_cnn()) and not has_conv2d(nn.Linear(3, 2))
    assert use_channels_last("auto", small_cnn(), cpu)
    assert not use_channels_last("auto", small_cnn(), gpu)
    assert not use_channels_last("auto", nn.Linear(3, 2), cpu)
    assert use_channels_last("channels_last", small_cnn(), gpu)
    assert not use_channels_last("contiguous", small_cnn(), cpu)


def _probe(model):
    x = torch.rand(2, 1, 8, 8)
    return lambda to_batch: model(to_batch(x))


def test_preflight_falls_back_for_models_that_view_conv_outputs_and_leaves_them_untouched():
    model = ViewsActivations()
    before = {name: (t.data_ptr(), t.stride()) for name, t in model.state_dict().items()}
    assert preflight_layout("auto", model, _probe(model)) == "contiguous"
    assert {name: (t.data_ptr(), t.stride()) for name, t in model.state_dict().items()} == before
    with pytest.raises(ConfigError, match="memory_format='channels_last'.*reshape\\(\\).*'contiguous'"):
        preflight_layout("channels_last", model, _probe(model))
    assert model.conv.weight.is_contiguous()


def test_preflight_keeps_auto_for_models_that_run_channels_last():
    model = small_cnn()
    assert preflight_layout("auto", model, _probe(model)) == "auto"
    assert model[0].weight.is_contiguous()  # probed on a restrided copy of the tensors, then put back
    assert preflight_layout("contiguous", model, _probe(model)) == "contiguous"


def test_unknown_memory_format_lists_the_choices():
    with pytest.raises(ConfigError, match="auto, channels_last, contiguous; got 'nhwc'"):
        preflight_layout("nhwc", small_cnn(), _probe(small_cnn()))


def _reference(model: nn.Module, x, y, epochs: int, batch: int) -> nn.Module:
    """Plain NCHW PyTorch on the same batches the worker sees (no shuffle, one rank)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(epochs):
        for i in range(0, len(x), batch):
            opt.zero_grad()
            F.cross_entropy(model(x[i : i + batch]), y[i : i + batch]).backward()
            opt.step()
    return model


@pytest.mark.parametrize("memory_format", ["auto", "contiguous"])
def test_worker_trains_channels_last_to_the_nchw_result(memory_format):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(96, 1, 8, 8, generator=gen), torch.randint(0, 3, (96,), generator=gen)
    model = small_cnn()
    reference = _reference(copy.deepcopy(model), x, y, epochs=2, batch=32)
    seen = []
    # NHWC strides of a 1-channel batch: the channel stride is 1, not H*W
    model[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].stride(1) == 1))
    spec = FitSpec(
        model=model,
        loss=F.cross_entropy,
        optimizer=optimizer_factory("sgd", model, lr=0.1, momentum=0.9),
        strategy=resolve_strategy("allreduce"),
        train=TensorData(x, y),
        eval=TensorData(x, y),
        training=TrainingConfig(epochs=2, batch_size=32, shuffle=False, memory_format=memory_format),
    )
    out = fit_worker(spec, SingleProcessCollective())
    assert set(seen) == {memory_format == "auto"}  # every batch, training and evaluation
    for name, want in reference.state_dict().items():
        got = model.state_dict()[name]
        assert got.is_contiguous(), f"{name} left the worker restrided"
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)
    assert "test_accuracy" in out.history[-1]


def test_channels_last_gradients_are_as_accurate_as_nchw():
    """Channels-last changes the order of the sums, not their precision.

    Both layouts' float32 gradients of the zoo CNN are compared with a float64 NCHW
    reference: a kernel that computed in lower precision (bf16 "fast math", say) would
    show errors orders of magnitude above NCHW's ~1e-6.
    """
    from sparkdp.models.zoo import build_model

    torch.manual_seed(0)
    model = build_model("cnn")
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen)

    def grads(layout, dtype):
        m = copy.deepcopy(model).to(dtype=dtype, memory_format=layout)
        F.cross_entropy(m(x.to(dtype=dtype, memory_format=layout)), y).backward()
        return [p.grad.double().contiguous() for p in m.parameters()]

    exact = grads(torch.contiguous_format, torch.float64)
    errors = {}
    for name, layout in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        errors[name] = max(
            ((g - e).norm() / e.norm()).item()
            for g, e in zip(grads(layout, torch.float32), exact, strict=True)
        )
    assert errors["nchw"] < 1e-5, errors
    assert errors["nhwc"] < max(4 * errors["nchw"], 1e-5), errors
