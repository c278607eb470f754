"""Models that compute their own loss on dict batches (loss="model"), evaluation's token-mean
loss and perplexity against a hand computation, and a user metric."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from sparkdp import model_loss
from sparkdp.comm.single import SingleProcessCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.parquet import ParquetData
from sparkdp.data.tensors import DictData, as_worker_data
from sparkdp.errors import ConfigError, DataError
from sparkdp.strategies import resolve_strategy
from sparkdp.train.batch import ModelLoss
from sparkdp.train.loop import FitSpec, evaluate, fit_worker, metric_names
from sparkdp.train.optim import optimizer_factory, resolve_loss
from tests.train.lm_models import LENGTH, VOCAB, TinyCausalLM, token_data

pytestmark = pytest.mark.timeout(60)


def _fit(model, data, loss="model", **kw):
    spec = FitSpec(
        model=model,
        loss=resolve_loss(loss) if isinstance(loss, str) else loss,
        optimizer=optimizer_factory("adam", model, lr=0.05),
        strategy=resolve_strategy("allreduce"),
        train=data,
        eval=kw.pop("eval", None),
        training=TrainingConfig(**{"epochs": 3, "batch_size": 8, **kw}),
    )
    return fit_worker(spec, SingleProcessCollective())


@pytest.mark.parametrize("as_dict", [False, True], ids=["output.loss", "output['loss']"])
def test_loss_model_trains_on_the_models_own_loss(as_dict):
    report = _fit(TinyCausalLM(as_dict=as_dict), DictData(token_data(32)))
    assert report.history[-1]["loss"] < report.history[0]["loss"]


def test_model_loss_fn_gets_the_model_and_the_batch():
    seen = []

    def loss(model, batch):
        seen.append(sorted(batch))
        out = model(batch["input_ids"])
        return F.cross_entropy(out.logits.reshape(-1, VOCAB), batch["input_ids"].reshape(-1))

    report = _fit(TinyCausalLM(), DictData(token_data(16)), loss=model_loss(loss), epochs=1)
    assert seen[0] == ["attention_mask", "input_ids", "labels"] and report.history[0]["samples"] == 16


def test_a_loss_the_model_does_not_return_is_named():
    model = TinyCausalLM()
    batch = token_data(4)
    del batch["labels"]
    with pytest.raises(ConfigError, match="needs a scalar loss.*Put 'labels' in the batch"):
        ModelLoss()(model, batch, None)


def test_perplexity_is_exp_of_the_token_mean_loss_by_hand():
    model = TinyCausalLM(seed=3)
    data = token_data(10)  # odd rows: two padded positions, so rows count 5 or 3 tokens
    names = ("top1",)

    def metric(out, batch):
        hit = (out.logits[:, :-1].argmax(-1) == batch["labels"][:, 1:]) & (batch["labels"][:, 1:] != -100)
        return {"top1": (float(hit.sum()), float((batch["labels"][:, 1:] != -100).sum()))}

    got = evaluate(
        model,
        ModelLoss(),
        DictData(data),
        SingleProcessCollective(),
        batch_size=4,
        metric=metric,
        metric_names=names,
    )
    with torch.no_grad():  # the reference: every counted token's NLL, one mean
        logits = model(data["input_ids"], data["attention_mask"]).logits
        nll = F.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB),
            data["labels"][:, 1:].reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        tokens = int((data["labels"][:, 1:] != -100).sum())
        hits = ((logits[:, :-1].argmax(-1) == data["labels"][:, 1:]) & (data["labels"][:, 1:] != -100)).sum()
    assert tokens == 5 * 5 + 5 * 3
    assert got["test_loss"] == pytest.approx(float(nll) / tokens, rel=1e-5)
    assert got["test_perplexity"] == pytest.approx(math.exp(float(nll) / tokens), rel=1e-5)
    assert got["test_top1"] == pytest.approx(float(hits) / tokens)
    # batches of 4, 4, 2 rows hold different token counts: a mean of batch means would differ
    assert abs(got["test_loss"] - _mean_of_batch_means(model, data)) > 1e-4


def _mean_of_batch_means(model, data):
    with torch.no_grad():
        losses = [float(model(**{k: v[i : i + 4] for k, v in data.items()}).loss) for i in range(0, 10, 4)]
    return float(np.mean(losses))


def test_a_metric_value_is_a_row_weighted_batch_mean_and_its_names_are_checked():
    model = TinyCausalLM()
    data = DictData(token_data(10))
    got = evaluate(
        model,
        ModelLoss(),
        data,
        SingleProcessCollective(),
        batch_size=4,
        metric=lambda out, batch: {"first": float(batch["input_ids"][:, 0].float().mean())},
        metric_names=("first",),
    )
    assert got["test_first"] == pytest.approx(float(token_data(10)["input_ids"][:, 0].float().mean()))
    with pytest.raises(ConfigError, match="a number or a \\(sum, count\\) pair"):
        metric_names(lambda out, batch: {"bad": "text"}, None, {}, None)


def test_fit_evaluates_a_language_model_with_perplexity():
    report = _fit(TinyCausalLM(), DictData(token_data(32)), eval=DictData(token_data(16, seed=5)))
    last = report.history[-1]
    assert last["test_perplexity"] == pytest.approx(math.exp(last["test_loss"]))
    assert "test_accuracy" not in last


def test_in_memory_dicts_become_dict_batches_and_unequal_rows_are_refused():
    data = as_worker_data(
        {"input_ids": np.zeros((6, LENGTH), np.int64), "labels": np.zeros((6, LENGTH), np.int64)}
    )
    ((x, y),) = list(data.batches(rank=0, world_size=1, epoch=0, batch_size=8, seed=0))
    assert set(x) == {"input_ids", "labels"} and x["input_ids"].shape == (6, LENGTH) and y is None
    shards = [next(data.batches(rank=r, world_size=2, epoch=0, batch_size=8, seed=0))[0] for r in range(2)]
    assert [len(s["input_ids"]) for s in shards] == [3, 3]
    with pytest.raises(DataError, match="same number of rows"):
        DictData({"a": np.zeros((3, 2)), "b": np.zeros((4, 2))})


def test_parquet_array_columns_arrive_as_int64_dict_batches(tmp_path):
    data = token_data(20)
    n = LENGTH
    table = pa.table(
        {
            "input_ids": pa.FixedSizeListArray.from_arrays(
                pa.array(data["input_ids"].reshape(-1).numpy(), pa.int32()), n
            ),
            "attention_mask": pa.array(
                data["attention_mask"].tolist(), pa.list_(pa.int8())
            ),  # a variable-size list
            "labels": pa.FixedSizeListArray.from_arrays(pa.array(data["labels"].reshape(-1).numpy()), n),
            "weight": pa.array(np.linspace(0, 1, 20), pa.float64()),
        }
    )
    pq.write_table(table, tmp_path / "tokens.parquet", row_group_size=7)
    parquet = ParquetData(
        tmp_path / "tokens.parquet",
        features=["input_ids", "attention_mask", "labels", "weight"],
        label=None,
        dict_batches=True,
    )
    batches = list(parquet.eval_batches(rank=0, world_size=1, batch_size=8))
    x, y = batches[0]
    assert y is None and [len(b[0]["labels"]) for b in batches] == [8, 8, 4]
    assert x["input_ids"].dtype == torch.int64 and x["input_ids"].shape == (8, n)
    assert x["attention_mask"].dtype == torch.int64 and x["weight"].dtype == torch.float32
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(torch.cat([b[0][key] for b in batches]), data[key]), key
    assert "features['input_ids'] int64 (batch, 6)" in parquet.describe()
    report = _fit(
        TinyCausalLM(),
        ParquetData(
            tmp_path / "tokens.parquet",
            label=None,
            dict_batches=True,
            features=["input_ids", "attention_mask", "labels"],
        ),
        epochs=2,
    )
    assert report.history[-1]["loss"] < report.history[0]["loss"]


def test_a_hugging_face_causal_lm_trains_with_loss_model():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=8, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    report = _fit(
        model,
        DictData(token_data(32)),
        eval=DictData(token_data(8, seed=4)),
        epochs=2,
        precision="bf16-mixed",
        accumulate=2,
        clip_grad_norm=1.0,
    )
    assert report.history[-1]["loss"] < report.history[0]["loss"]
    assert math.isfinite(report.history[-1]["test_perplexity"])
