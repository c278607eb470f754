"""The built-in GPT: shapes, causality, the loss against F.cross_entropy, sizes, and learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparkdp.errors import ConfigError
from sparkdp.models import MODELS, build_model
from sparkdp.models.gpt import GPT, GPTBlock


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return build_model("gpt-tiny", **kw)


def test_output_shapes_and_dict_access():
    model = tiny()
    ids = torch.randint(0, 256, (3, 10))
    out = model(ids)
    assert out.logits.shape == (3, 10, 256)
    assert out.loss is None and "loss" not in out
    out = model(ids, labels=ids)
    assert out["loss"] is out.loss and out.loss.shape == ()
    assert sum(isinstance(m, GPTBlock) for m in model.modules()) == 2


def test_a_later_token_never_changes_earlier_logits():
    model = tiny().eval()
    ids = torch.randint(0, 256, (2, 16))
    changed = ids.clone()
    changed[:, 9] = (ids[:, 9] + 1) % 256
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_loss_is_shifted_cross_entropy_ignoring_minus_100():
    model = tiny().eval()
    ids = torch.randint(0, 256, (2, 12))
    labels = ids.clone()
    labels[0, 5:8] = -100
    out = model(ids, labels=labels)
    logits = out.logits
    # by hand: position t predicts labels[t + 1]; the three -100 targets are left out of the mean
    terms = [
        F.cross_entropy(logits[b, t], labels[b, t + 1])
        for b in range(2)
        for t in range(11)
        if labels[b, t + 1] != -100
    ]
    assert len(terms) == 22 - 3
    torch.testing.assert_close(out.loss, torch.stack(terms).mean())


def test_attention_mask_hides_padding_from_real_tokens():
    model = tiny().eval()
    ids = torch.randint(1, 256, (1, 8))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 8), torch.zeros(1, 4)], dim=1)
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :8], model(ids).logits)
    left = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    left_mask = torch.cat([torch.zeros(1, 4), torch.ones(1, 8)], dim=1)
    out = model(left, attention_mask=left_mask).logits
    assert torch.isfinite(out).all()  # padded queries attend at least to themselves: no NaN rows


def _count(vocab: int, block: int, layers: int, d: int) -> int:
    # embeddings + per block (2 LayerNorms 4d, qkv 3d^2+3d, proj d^2+d, MLP 8d^2+5d) + final LayerNorm;
    # the head is the token embedding (tied), so it adds nothing
    return vocab * d + block * d + layers * (12 * d * d + 13 * d) + 2 * d


@pytest.mark.parametrize(
    ("name", "expected"), [("gpt", _count(8192, 256, 6, 384)), ("gpt-tiny", _count(256, 64, 2, 32))]
)
def test_preset_parameter_counts(name, expected):
    model = build_model(name)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.lm_head.weight is model.wte.weight
    assert name in MODELS.get(name).name
    if name == "gpt":
        assert 10_000_000 <= expected <= 30_000_000


def test_options_override_the_preset_and_bad_ones_are_explained():
    model = build_model("gpt-tiny", vocab_size=50, block_size=8)
    assert model.wte.num_embeddings == 50 and model.wpe.num_embeddings == 8
    with pytest.raises(ValueError, match="exceed block_size 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ConfigError, match="multiple of n_head"):
        build_model("gpt-tiny", d_model=30, n_head=4)
    with pytest.raises(ConfigError, match="unknown option.*n_embd"):
        build_model("gpt", n_embd=128)


def test_a_few_steps_lower_the_loss_on_a_repeated_sequence():
    model = tiny(dropout=0.1)
    seq = torch.arange(32).repeat(2)[None, :64].repeat(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(seq, labels=seq).loss
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert model(seq, labels=seq).loss.item() < 0.5 * first
