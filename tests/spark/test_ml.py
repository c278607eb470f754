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
    return spark.createDataFrame(
        [(i, *map(float, row), int(t)) for i, (row, t) in enumerate(zip(x, y, strict=True))],
        ["id", "a", "b", "c", "d", "label"],
    )


def test_pipeline_fit_transform_save_load(spark, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from sparkdp.ml import Estimator, Model

    df = _df(spark).cache()
    try:
        est = Estimator(
            model="linear",
            modelKwargs=json.dumps({"image_size": 2, "num_classes": 2}),
            featureShape=[1, 2, 2],
            epochs=2,
            workers=2,
            batchSize=16,
            learningRate=0.1,
            probabilityCol="probability",
        )
        pipeline = Pipeline(
            stages=[VectorAssembler(inputCols=["a", "b", "c", "d"], outputCol="features"), est]
        )
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
    assert (back.getOrDefault("model"), back.getOrDefault("epochs"), back.getOrDefault("strategy")) == (
        "mlp",
        3,
        "average",
    )
    with pytest.raises(ConfigError, match="no network given"):
        Estimator()._build_module()
    with pytest.raises(ConfigError, match="modelKwargs must be a JSON object"):
        Estimator(model="mlp", modelKwargs="[1]")._build_module()
    with pytest.raises(ConfigError, match="cannot be imported"):
        Estimator(moduleFactory="nowhere.at_all:f")._build_module()


def make_small_net(width: int = 3):
    """A module-level factory, as a user's package would define one (trusted only when told)."""
    from torch import nn

    return nn.Linear(4, width)


def _saved_with_factory(tmp_path, name="m"):
    from sparkdp.ml import Model
    from sparkdp.spark.ml import factory_path

    model = Model()
    # set as Spark's reader sets loaded params: not through the constructor, so nothing is trusted
    model.set(model.moduleFactory, factory_path(make_small_net))
    model.set(model.modelKwargs, '{"width": 2}')
    model.module = make_small_net(2)
    model.write().overwrite().save(str(tmp_path / name))
    return tmp_path / name


def _edit_saved_params(folder, **params):
    meta_dir = folder / "metadata"
    part = next(p for p in meta_dir.iterdir() if p.name.startswith("part-"))
    meta = json.loads(part.read_text())
    meta["paramMap"].update(params)
    part.write_text(json.dumps(meta) + "\n")
    for crc in meta_dir.glob(".*.crc"):  # Hadoop would reject the edited file against its old checksum
        crc.unlink()


def test_loading_never_calls_a_factory_nobody_trusted(spark, tmp_path, monkeypatch):
    """Saved metadata edited to name os:system must not run a command on Model.load."""
    import sparkdp.spark.ml as ml_impl
    from sparkdp.ml import Model

    monkeypatch.setattr(ml_impl, "_TRUSTED", set())
    folder = _saved_with_factory(tmp_path)
    canary = tmp_path / "pwned"
    _edit_saved_params(
        folder, moduleFactory="os:system", modelKwargs=json.dumps({"command": f"touch {canary}"})
    )
    with pytest.raises(
        ConfigError, match=r"moduleFactory 'os:system'.*not been told to trust.*trusted_factories"
    ):
        Model.load(str(folder))
    from pyspark.ml import PipelineModel

    pipe = PipelineModel(
        stages=[Model.load(str(_saved_with_factory(tmp_path, "ok")), trusted_factories=[make_small_net])]
    )
    pipe.write().overwrite().save(str(tmp_path / "pipe"))
    stage_dir = next((tmp_path / "pipe" / "stages").iterdir())
    _edit_saved_params(
        stage_dir, moduleFactory="os:system", modelKwargs=json.dumps({"command": f"touch {canary}"})
    )
    with pytest.raises(ConfigError, match="not been told to trust"):
        PipelineModel.load(str(tmp_path / "pipe"))
    assert not canary.exists()


def test_a_factory_loads_when_trusted_explicitly_or_registered(spark, tmp_path, monkeypatch):
    import torch

    import sparkdp.spark.ml as ml_impl
    from sparkdp.ml import Estimator, Model, trust_factory

    monkeypatch.setattr(ml_impl, "_TRUSTED", set())
    folder = _saved_with_factory(tmp_path)
    with pytest.raises(ConfigError, match="test_ml:make_small_net"):
        Model.load(str(folder))
    loaded = Model.load(str(folder), trusted_factories=[make_small_net])
    assert isinstance(loaded.module, torch.nn.Linear) and loaded.module.out_features == 2
    assert ml_impl._TRUSTED == set()  # an explicit allow-list applies to that one load only
    assert trust_factory(make_small_net) is make_small_net  # usable as a decorator
    assert Model.load(str(folder)).module.out_features == 2
    monkeypatch.setattr(ml_impl, "_TRUSTED", set())
    Estimator(moduleFactory="tests.spark.test_ml:make_small_net")  # named in this process's code: trusted
    assert Model.load(str(folder)).module.out_features == 2
    with pytest.raises(ConfigError, match="trust_factory takes"):
        trust_factory("no-colon")


def test_loading_never_imports_the_class_the_metadata_names(spark, tmp_path, monkeypatch):
    """Spark's own reader imports and calls metadata['class']; sparkdp's readers check it instead."""
    from sparkdp.ml import Estimator, Model

    canary = tmp_path / "imported"
    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "planted_module.py").write_text(
        f"open({str(canary)!r}, 'w').close()\nclass Thing:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(module_dir))
    model_dir = _saved_with_factory(tmp_path)
    Estimator(model="mlp").write().overwrite().save(str(tmp_path / "est"))
    for folder, cls in ((model_dir, Model), (tmp_path / "est", Estimator)):
        part = next(p for p in (folder / "metadata").iterdir() if p.name.startswith("part-"))
        meta = json.loads(part.read_text())
        meta["class"] = "planted_module.Thing"
        part.write_text(json.dumps(meta) + "\n")
        for crc in (folder / "metadata").glob(".*.crc"):
            crc.unlink()
        with pytest.raises(
            ConfigError,
            match=r"for class 'planted_module.Thing', not 'sparkdp\.(spark\.)?ml\.(Model|Estimator)'",
        ):
            cls.load(str(folder))
    assert not canary.exists()


def test_a_loaded_estimator_names_trust_factory_when_its_factory_is_not_trusted(spark, tmp_path, monkeypatch):
    import sparkdp.spark.ml as ml_impl
    from sparkdp.ml import Estimator

    Estimator(moduleFactory="tests.spark.test_ml:make_small_net").write().overwrite().save(
        str(tmp_path / "e")
    )
    monkeypatch.setattr(ml_impl, "_TRUSTED", set())  # as in a new process
    loaded = Estimator.load(str(tmp_path / "e"))
    with pytest.raises(
        ConfigError,
        match=r"loaded or copied.*register it before fitting with "
        r"sparkdp.ml.trust_factory",
    ):
        loaded._build_module()


def _saved_built_in(tmp_path, name="builtin"):
    from sparkdp.ml import Model
    from sparkdp.models import build_model

    model = Model()
    model.set(model.model, "mlp")
    model.set(model.modelKwargs, '{"image_size": 2, "hidden": 4}')
    model.module = build_model("mlp", image_size=2, hidden=4)
    model.write().overwrite().save(str(tmp_path / name))
    return tmp_path / name


@pytest.mark.timeout(120)
def test_built_in_model_kwargs_that_would_allocate_terabytes_are_refused_on_load(spark, tmp_path):
    """Saved metadata edited to a hidden size H = 10^12 is refused before any tensor is allocated:
    2x2 inputs -> H -> 10 classes is 4H + H + 10H + 10 parameters (60 TB of float32). A model within
    the limit loads as saved."""
    import time

    from sparkdp.ml import Model

    folder = _saved_built_in(tmp_path)
    assert Model.load(str(folder)).module[1].weight.shape == (4, 4)
    _edit_saved_params(folder, modelKwargs=json.dumps({"image_size": 2, "hidden": 10**12}))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"'mlp' 15,000,000,000,010 parameters .*MAX_BUILTIN_PARAMETERS"):
        Model.load(str(folder))
    assert time.monotonic() - started < 30
    _edit_saved_params(folder, modelKwargs=json.dumps({"image_size": 2, "hidden": -5}))
    with pytest.raises(ConfigError, match="cannot be built with modelKwargs"):
        Model.load(str(folder))
    _edit_saved_params(folder, modelKwargs=json.dumps({"hidden": [1, 2]}))
    with pytest.raises(ConfigError, match="built-in models take numbers"):
        Model.load(str(folder))
