"""sparkdp.frozen: a model with a frozen base keeps, saves and loads its trainable part only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparkdp.errors import ConfigError
from sparkdp.frozen import expected_keys, load_model_state, store_frozen_in, trainable_state
from sparkdp.strategies.fsdp import adapter_units

pytestmark = pytest.mark.timeout(60)


class Adapted(nn.Module):
    """A frozen linear base with a trainable low-rank pair beside it, and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(4, 4)
        self.adapter = nn.ModuleDict({"a": nn.Linear(4, 1, bias=False), "b": nn.Linear(1, 4, bias=False)})
        self.register_buffer("seen", torch.zeros(1))
        self.base.requires_grad_(False)

    def forward(self, x):
        return self.base(x) + self.adapter["b"](self.adapter["a"](x))


def test_the_trainable_state_leaves_out_the_frozen_parameters_only():
    model = Adapted()
    assert sorted(trainable_state(model, model.state_dict())) == [
        "adapter.a.weight",
        "adapter.b.weight",
        "seen",
    ]
    everything = nn.Linear(2, 2)  # nothing frozen: the whole state
    assert trainable_state(everything, everything.state_dict()).keys() == everything.state_dict().keys()


def test_a_trainable_state_loads_into_the_same_base_and_nothing_else_does():
    model, other = Adapted(), Adapted()
    saved = trainable_state(model, model.state_dict())
    base = other.base.weight.detach().clone()
    load_model_state(other, saved)
    assert torch.equal(other.adapter["a"].weight, model.adapter["a"].weight)
    assert torch.equal(other.base.weight, base)  # the base is its own
    assert expected_keys(other, saved) == set(saved)
    with pytest.raises(ConfigError, match=r"missing: adapter.b.weight.*Load it into the model it was"):
        load_model_state(other, {k: v for k, v in saved.items() if k != "adapter.b.weight"})
    load_model_state(other, model.state_dict())  # a whole state still loads


def test_a_frozen_base_is_stored_in_bf16_and_the_adapters_stay_fp32():
    model = Adapted()
    assert store_frozen_in(model, torch.bfloat16) == (16 + 4) * 2  # 20 values, 4 bytes -> 2
    assert model.base.weight.dtype == torch.bfloat16 and model.adapter["a"].weight.dtype == torch.float32
    assert store_frozen_in(nn.Linear(2, 2), torch.bfloat16) == 0  # nothing frozen: nothing cast


def test_fsdp_shards_each_adapter_in_a_unit_of_its_own():
    # containers are never units (their forward is never called); their trainable members are
    assert adapter_units(Adapted()) == ["adapter.a", "adapter.b"]
    assert adapter_units(nn.Sequential(nn.Linear(2, 2))) == []
