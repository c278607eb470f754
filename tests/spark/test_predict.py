"""sparkdp.predict: batched Arrow-UDF inference equals the model applied locally with torch."""

import numpy as np
import pytest
import torch
from torch import nn

import sparkdp
from sparkdp.errors import ConfigError
from sparkdp.spark.predict import PackedModel

pytestmark = pytest.mark.spark


def _vectors_df(spark, x):
    from pyspark.ml.linalg import Vectors

    rows = []
    for i, row in enumerate(x):
        nz = np.nonzero(row)[0]
        vec = (
            Vectors.sparse(len(row), nz.tolist(), row[nz].tolist()) if i % 2 else Vectors.dense(row.tolist())
        )
        rows.append((i, vec))
    return spark.createDataFrame(rows, ["id", "features"]).repartition(2)


def test_classifier_predictions_and_probabilities_match_local_torch(spark):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 5)) * (rng.random((90, 5)) > 0.3)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    out = (
        sparkdp.predict(
            model, _vectors_df(spark, x), features="features", probability_col="probability", batch_size=7
        )
        .orderBy("id")
        .toPandas()
    )
    with torch.no_grad():
        logits = model(torch.from_numpy(x).float())
    assert out["id"].tolist() == list(range(90)), "every row kept, with its other columns"
    assert out["prediction"].tolist() == logits.argmax(1).tolist()
    np.testing.assert_allclose(np.stack(out["probability"]), torch.softmax(logits, 1).numpy(), atol=1e-6)
    assert model.training, "the caller's model is left as it was"


def test_raw_and_value_outputs_on_array_and_scalar_columns(spark):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 4)).astype(np.float32)
    df = spark.createDataFrame(
        [(i, x[i].tolist(), float(x[i, 0]), int(i)) for i in range(40)], ["id", "arr", "s", "t"]
    )
    torch.manual_seed(0)
    raw_model = nn.Linear(4, 2)
    raw = sparkdp.predict(raw_model, df, features="arr", output="raw").orderBy("id").toPandas()
    with torch.no_grad():
        np.testing.assert_allclose(
            np.stack(raw["prediction"]), raw_model(torch.from_numpy(x)).numpy(), atol=1e-6
        )
    value_model = nn.Linear(2, 1)
    val = sparkdp.predict(value_model, df, features=["s", "t"], output_col="score").orderBy("id").toPandas()
    with torch.no_grad():
        ref = value_model(torch.from_numpy(np.stack([x[:, 0], np.arange(40)], 1).astype(np.float32))).squeeze(
            1
        )
    np.testing.assert_allclose(val["score"].to_numpy(), ref.numpy(), atol=1e-5)


def test_packed_model_is_loaded_once_per_worker():
    model = nn.BatchNorm1d(3)
    model.register_buffer("scale", torch.tensor([2.0]), persistent=False)
    packed = PackedModel(model)
    first, second = packed.load(), packed.load()
    assert first is second, "cached by the hash of architecture + state"
    assert torch.equal(first.scale, torch.tensor([2.0])), "non-persistent buffers travel too"
    assert not first.training


def test_bad_arguments(spark):
    df = spark.createDataFrame([(1.0,)], ["a"])
    with pytest.raises(ConfigError, match=r"column\(s\) \['b'\] not in the DataFrame. Available columns: a"):
        sparkdp.predict(nn.Linear(1, 1), df, features="b")
    with pytest.raises(ConfigError, match="output must be one of auto, class, value, raw"):
        sparkdp.predict(nn.Linear(1, 1), df, features="a", output="probs")


class _Embedder(nn.Module):
    """A token-id model: an embedding then a linear head, as a language model's first layer."""

    def __init__(self, vocab: int = 11, classes: int = 3) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 4), nn.Linear(4, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


def test_integer_token_ids_reach_the_model_as_int64(spark):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 11, size=(30, 6))
    df = spark.createDataFrame([(i, ids[i].tolist()) for i in range(30)], "id long, input_ids array<bigint>")
    torch.manual_seed(0)
    model = _Embedder()
    out = (
        sparkdp.predict(model, df.repartition(2), features="input_ids", output="raw").orderBy("id").toPandas()
    )
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(np.stack(out["prediction"]), expected, atol=1e-6)


@pytest.mark.timeout(240)
def test_loss_output_against_cross_entropy_on_one_process(spark, tmp_path):
    pytest.importorskip("transformers")
    from tests.helpers.tiny_lm import tiny_lm

    lm = tiny_lm(tmp_path)
    rng = np.random.default_rng(3)
    vocab = lm.model.config.vocab_size
    ids = rng.integers(0, vocab, size=(24, 12))
    labels = ids.copy()
    labels[:, :4] = -100  # a masked prompt
    labels[5] = -100  # a row with nothing to score
    rows = [(i, ids[i].tolist(), labels[i].tolist()) for i in range(24)]
    df = spark.createDataFrame(rows, "id long, input_ids array<bigint>, labels array<bigint>").repartition(2)
    out = (
        sparkdp.predict(lm.model, df, features=["input_ids", "labels"], output="loss", batch_size=5)
        .orderBy("id")
        .toPandas()
    )
    with torch.no_grad():
        logits = lm.model(input_ids=torch.from_numpy(ids)).logits
    target = torch.from_numpy(labels)[:, 1:]
    per_token = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), target.reshape(-1), ignore_index=-100, reduction="none"
    ).reshape(24, 11)
    tokens = (target != -100).sum(1)
    assert out["tokens"].tolist() == tokens.tolist() and tokens[5] == 0
    scored = [i for i in range(24) if i != 5]
    np.testing.assert_allclose(
        out["loss"].to_numpy()[scored], (per_token.sum(1) / tokens.clamp(min=1)).numpy()[scored], rtol=1e-5
    )
    assert np.isnan(out["loss"][5]), "a row with no scored token has no loss"
    # the column's perplexity from the rows: the token-weighted mean, as one cross entropy over all tokens
    mean = (out["loss"][scored] * out["tokens"][scored]).sum() / out["tokens"].sum()
    whole = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), target.reshape(-1), ignore_index=-100
    )
    assert np.exp(mean) == pytest.approx(torch.exp(whole).item(), rel=1e-5)
    # without labels: the input ids themselves are the targets
    plain = sparkdp.predict(lm.model, df, features="input_ids", output="loss").orderBy("id").toPandas()
    full = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, vocab), torch.from_numpy(ids)[:, 1:].reshape(-1), reduction="none"
    ).reshape(24, 11)
    np.testing.assert_allclose(plain["loss"].to_numpy(), full.mean(1).numpy(), rtol=1e-5)
    assert plain["tokens"].tolist() == [11] * 24


@pytest.mark.timeout(240)
def test_errors_are_one_line(spark):
    ids = spark.createDataFrame([([1, 2, 3],), ([4, 5, 60],)], "input_ids array<bigint>")
    with pytest.raises(ConfigError, match=r"output='class' needs \(rows, classes\) scores; the model gives"):
        sparkdp.predict(_LM(), ids, features="input_ids", output="class")
    with pytest.raises(ConfigError, match="output='loss' scores token ids: the feature column"):
        sparkdp.predict(_LM(), spark.createDataFrame([(1.0,)], ["a"]), features="a", output="loss")
    # an id out of the vocabulary in the second row: only an executor meets it
    with pytest.raises(Exception) as caught:
        sparkdp.predict(_LM(), ids.coalesce(1), features="input_ids", output="raw", batch_size=1).collect()
    text = str(caught.value)
    assert (
        "sparkdp.errors.WorkerFailed: predict failed on an executor: IndexError: index out of range" in text
    )
    assert len(text.strip().splitlines()) <= 6, text


class _LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)
