import os

import pytest
import safetensors.torch
import torch
from torch import nn

from sparkdp.errors import ConfigError
from sparkdp.state import save_state, state_from_bytes, state_to_bytes
from sparkdp.train.optim import optimizer_factory, resolve_loss


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def test_an_optimizer_instance_is_rebuilt_with_its_param_groups_on_a_copy():
    model = _model()
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 0.5}, {"params": model[1].parameters()}],
        lr=0.1,
        momentum=0.9,
        weight_decay=1e-4,
    )
    copy = _model()
    rebuilt = optimizer_factory(opt, model).build(copy)
    assert isinstance(rebuilt, torch.optim.SGD) and len(rebuilt.param_groups) == 2
    assert rebuilt.param_groups[0]["lr"] == 0.5 and rebuilt.param_groups[1]["lr"] == 0.1
    assert rebuilt.param_groups[1]["momentum"] == 0.9
    assert rebuilt.param_groups[0]["params"][0] is copy[0].weight


def test_names_classes_and_factories():
    model = _model()
    assert optimizer_factory("sgd", model).build(model).defaults["momentum"] == 0.9
    assert optimizer_factory(torch.optim.Adam, model, lr=0.3).build(model).defaults["lr"] == 0.3
    assert isinstance(
        optimizer_factory(lambda ps: torch.optim.RMSprop(ps), model).build(model), torch.optim.RMSprop
    )
    with pytest.raises(ConfigError, match="Unknown optimizer 'lion'. Available: adadelta, adagrad, adam"):
        optimizer_factory("lion", model)
    foreign = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="parameters that are not the model's"):
        optimizer_factory(foreign, model)
    with pytest.raises(ConfigError, match="Unknown loss 'hinge'"):
        resolve_loss("hinge")


def test_state_bytes_round_trip_without_pickle_even_with_tied_weights():
    model = _model()
    model[1].weight = nn.Parameter(model[0].weight[:2, :3].clone())
    state = model.state_dict()
    back = state_from_bytes(state_to_bytes(state))
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_failed_save_leaves_the_good_file_in_place(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    save_state(_model().state_dict(), path)
    good = path.read_bytes()

    def boom(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr("sparkdp.state.save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_state(nn.Linear(9, 9).state_dict(), path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    safetensors.torch.load_file(path)
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))
