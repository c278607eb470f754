"""sparkdp.state: the one pickle-free format for nested state, checked on real optimizer state."""

import pytest
import torch
from safetensors.torch import save

from sparkdp import state


def test_an_adam_state_dict_round_trips_exactly():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    back = state.from_bytes(state.to_bytes(saved))
    assert back["param_groups"] == saved["param_groups"]  # tuples (betas), None, bools, int lists
    assert set(back["state"]) == {0, 1}  # int keys stay ints
    for idx, entry in saved["state"].items():
        for key, value in entry.items():
            assert torch.equal(back["state"][idx][key], value), (idx, key)
    fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters())
    fresh.load_state_dict(back)  # what the DataFrame path does between epochs


def test_values_outside_the_format_are_named():
    with pytest.raises(TypeError, match=r"state value at state\.sched\.fn has type function"):
        state.to_bytes({"sched": {"fn": lambda: 0}})


def test_plain_safetensors_are_not_taken_for_state():
    with pytest.raises(ValueError, match="not sparkdp state"):
        state.from_bytes(save({"w": torch.zeros(2)}))


@pytest.mark.parametrize("cut", [4, 100, -5], ids=["header length", "header", "tensor data"])
def test_a_truncated_file_is_a_value_error_naming_it(tmp_path, cut):
    path = tmp_path / "state.safetensors"
    state.save({"w": torch.arange(50.0), "n": 3}, path)
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(ValueError, match=f"{path.name} is not a readable sparkdp state file"):
        state.load(path)


def test_a_missing_file_stays_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        state.load(tmp_path / "absent.safetensors")
