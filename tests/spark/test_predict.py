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
