"""A Hugging Face GPT-2 trained by ``fit`` on 2 Spark workers (fsdp: sharded checkpoints, the
result joined on the driver; allreduce: whole checkpoints) exported twice: from the result
(``TrainResult.save_pretrained``) and from the job's checkpoint directory (``sparkdp export``).
Hugging Face's own ``AutoModelForCausalLM`` and ``AutoTokenizer`` open both and give the
in-memory result's logits."""

from __future__ import annotations

import json

import pytest
import torch

import sparkdp
from sparkdp.cli.main import main
from sparkdp.data.text import train_bpe_tokenizer

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the end of the story"] * 10
BLOCK = 16


def gpt2(vocab: int) -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits.float()


@pytest.mark.parametrize("strategy", ["fsdp", "allreduce"])
def test_a_fit_result_and_its_checkpoint_export_to_what_hugging_face_opens(spark, tmp_path, strategy):
    tokenizer = train_bpe_tokenizer(TEXTS, 300)
    vocab = tokenizer.get_vocab_size()
    ids = torch.randint(0, vocab, (32, BLOCK), generator=torch.Generator().manual_seed(0))
    model = gpt2(vocab)
    initial = logits(model, ids[:4])
    result = sparkdp.fit(
        model,
        {"input_ids": ids, "labels": ids},
        loss="model",
        optimizer="adamw",
        optimizer_options={"lr": 1e-2},
        strategy=strategy,
        strategy_options={"min_params": 1000} if strategy == "fsdp" else {},
        workers=2,
        batch_size=4,
        epochs=1,
        checkpoint_dir=str(tmp_path / "ckpt"),
        spark=spark,
        show_progress=False,
    )
    expected = logits(result.model, ids[:4])
    assert (expected - initial).abs().max() > 1e-3  # it trained: not two untrained models compared
    series = "shards-" if strategy == "fsdp" else "ckpt-"
    assert any(p.name.startswith(series) for p in (tmp_path / "ckpt").iterdir())

    result.save_pretrained(tmp_path / "result", tokenizer=tokenizer)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    argv = ["export", str(tmp_path / "ckpt"), str(tmp_path / "exported"), "--tokenizer"]
    assert main([*argv, str(tmp_path / "tokenizer.json")]) == 0

    for out in ("result", "exported"):
        opened = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / out)
        assert type(opened).__name__ == "GPT2LMHeadModel"
        assert (logits(opened, ids[:4]) - expected).abs().max() <= 1e-4, out
        hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / out)
        assert hf_tokenizer("the cat")["input_ids"] == tokenizer.encode("the cat").ids
        assert "token_type_ids" not in hf_tokenizer("the cat")
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["n_layer"] == 2


@pytest.mark.timeout(60)
def test_export_refuses_a_directory_without_checkpoints_and_an_existing_target(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "holds no synchronous checkpoint" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
