"""A local Hugging Face directory as the model: what ``from_pretrained`` opens, safetensors only."""

from __future__ import annotations

import pytest
import torch

from sparkdp.errors import ConfigError
from sparkdp.models.hf import load_hf_model, resolve_model
from tests.helpers.hf_dirs import counting_blocks, tiny_gpt2_dir

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(60)


def test_the_directory_opens_as_hugging_faces_own_loader_opens_it(tmp_path):
    where = tiny_gpt2_dir(tmp_path / "gpt2")
    ours = resolve_model(f"hf:{where}")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(where)
    assert type(ours) is transformers.GPT2LMHeadModel
    ids = torch.as_tensor(counting_blocks(2))
    ours.eval()
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).logits, theirs(input_ids=ids).logits)


def test_the_opened_model_trains_on_packed_rows_which_the_directorys_cache_setting_would_refuse(tmp_path):
    from sparkdp.data.sft import ExamplePacker
    from sparkdp.train.packing import check_packing

    where = tiny_gpt2_dir(tmp_path / "gpt2")
    packer = ExamplePacker(16, 0, True, "truncate")
    packer.add(
        [([1, 2, 3, 4, 5], [-100, 2, 3, 4, 5]), ([30, 31, 32, 33, 34, 35, 36], [-100] + list(range(31, 37)))]
    )
    row = {k: torch.tensor(v) for k, v in packer.finish().to_pydict().items()}
    as_saved = transformers.AutoModelForCausalLM.from_pretrained(where)
    assert as_saved.config.use_cache  # GPT-2's default, saved in config.json
    with pytest.raises(ConfigError, match=r"set model.config.use_cache = False"):
        check_packing(as_saved, row)
    check_packing(load_hf_model(where), row)  # the model sparkdp opens for training passes


def test_pickled_weights_are_refused_not_loaded(tmp_path):
    where = tiny_gpt2_dir(tmp_path / "gpt2")
    (where / "model.safetensors").rename(where / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"only pytorch_model.bin, a pickle sparkdp does not load\)"):
        load_hf_model(where)


def test_a_directory_without_a_config_or_a_string_that_is_no_source(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json. Give the directory save_pretrained wrote"):
        load_hf_model(tmp_path)
    with pytest.raises(ConfigError, match=r"pass a torch.nn.Module, or 'hf:DIR'"):
        resolve_model(str(tmp_path))
