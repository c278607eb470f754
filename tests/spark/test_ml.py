"""sparkdp.ml.Estimator/Model inside a pyspark.ml Pipeline: fit, transform, save, load."""

import json
import os

import numpy as np
import pytest

from sparkdp.errors import ConfigError

pytestmark = pytest.mark.spark


def _df(spark, n=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = (x @ np.array([1.0, -2.0, 0.5, 1.5]) > 0).astype(int)
    return spark.createDataFrame([(i, *map(float, row), int(t)) for i, (row, t) in enumerate(zip(x, y, strict=True))],
                                 ["id", "a", "b", "c", "d", "label"])


def test_pipeline_fit_transform_save_load(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdp.ml import Estimator, Model

    df = _df(spark).cache()
    try:
        est = Estimator(model="linear", modelKwargs=json.dumps({"image_size": 2, "num_classes": 2}),
                        featureShape=[1, 2, 2], epochs=2, workers=2, batchSize=16, learningRate=0.1,
                        probabilityCol="probability")
        pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features"), est])
        fitted = pipeline.fit(df)
        assert isinstance(fitted.stages[-1], Model)
        scored = fitted.transform(df).orderBy("id").toPandas()
        accuracy = (scored["prediction"] == scored["label"]).mean()
        assert accuracy > 0.85, f"accuracy {accuracy}"
        fitted.write().overwrite().save(str(tmp_path / "pipe"))
        files = {f for _root, _dirs, names in os.walk(tmp_path / "pipe") for f in names}
        assert {"module.safetensors", "module.json"} <= files
        assert not any(f.endswith((".pkl", ".pickle", ".dill")) for f in files)
        loaded = PipelineModel.load(str(tmp_path / "pipe"))
        again = loaded.transform(df).orderBy("id").toPandas()
    finally:
        df.unpersist()
    assert again["prediction"].tolist() == scored["prediction"].tolist()
    np.testing.assert_allclose(np.stack(again["probability"]), np.stack(scored["probability"]), atol=0)
    assert loaded.stages[-1].getOrDefault("epochs") == 2


def test_estimator_params_round_trip_and_errors(spark, tmp_path):
    from sparkdp.ml import Estimator

    est = Estimator(model="mlp", modelKwargs='{"hidden": 8}', epochs=3, strategy="average")
    est.write().overwrite().save(str(tmp_path / "est"))
    back = Estimator.load(str(tmp_path / "est"))
    assert (back.getOrDefault("model"), back.getOrDefault("epochs"), back.getOrDefault("strategy")) == \
        ("mlp", 3, "average")
    with pytest.raises(ConfigError, match="no network given"):
        Estimator()._build_module()
    with pytest.raises(ConfigError, match="modelKwargs must be a JSON object"):
        Estimator(model="mlp", modelKwargs="[1]")._build_module()
    with pytest.raises(ConfigError, match="cannot be imported"):
        Estimator(moduleFactory="nowhere.at_all:f")._build_module()
