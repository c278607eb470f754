"""Spark ML integration: ``Estimator`` (fit -> ``Model``, a Transformer) for ``pyspark.ml.Pipeline``.

The network is described by data, never by pickled objects: either a built-in
model name from :data:`sparkdp.models.MODELS` plus JSON keyword arguments, or the
import path of a module factory (``"my_pkg.nets:make_net"``). A saved model is
Spark's usual params metadata plus ``module.safetensors`` (the trained state
dict) and ``module.json`` (how to rebuild the network, the column layout and the
training history) — loading it executes no pickle, and a named factory only when
this process trusts it.

Which factories are trusted: a factory is code, and a saved model's metadata is a file
anyone who can write the model's directory could have edited (``moduleFactory="os:system"``
would run a command on load). So loading imports and calls a factory only if this process
said it trusts it: set through ``Estimator(moduleFactory=...)``/``setParams`` in this process,
registered with :func:`trust_factory` (a decorator, also for pipelines loaded with
``PipelineModel.load``), or passed to ``Model.load(path, trusted_factories=[...])`` — the way
``torch.load(weights_only=True)`` needs ``add_safe_globals``. Built-in model names
(:data:`sparkdp.models.MODELS`) are always allowed: they are sparkdp's own code, and their
keyword arguments are JSON values. For the same reason the class the params metadata names is
checked, never imported: Spark's own ``DefaultParamsReader`` imports and calls it.
(``PipelineModel.load`` is Spark's code and imports each stage's class by name before the
stage's own reader runs: load pipelines only from directories you trust.)

Model files are written with Python file I/O, so the save path must be on a
filesystem the driver can write (local disk, NFS, a FUSE mount such as /dbfs).
"""

from __future__ import annotations

import importlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

from pyspark import keyword_only
from pyspark.ml import Estimator as SparkEstimator
from pyspark.ml import Model as SparkModel
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasSeed
from pyspark.ml.util import (
    DefaultParamsReadable,
    DefaultParamsReader,
    DefaultParamsWritable,
    DefaultParamsWriter,
)
from torch import nn

from ..errors import ConfigError
from ..state import load_state, save_state
from .predict import predict

_MODULE_FILE, _DESC_FILE = "module.safetensors", "module.json"
_TRUSTED: set[str] = set()  # 'module:qualname' of the factories this process may import and call
_TRUSTED_LOCK = threading.Lock()
#: The most parameters a built-in model may have (2^30: 4 GiB of float32, ~300 times the largest
#: default). Its keyword arguments are JSON that a saved model's metadata may carry from anyone who
#: could write the directory, and ``{"hidden": 1000000000000}`` would allocate terabytes on load.
MAX_BUILTIN_PARAMETERS = 1 << 30


def trust_factory(factory: Callable[..., nn.Module] | str) -> Callable[..., nn.Module] | str:
    """Allow this process to import and call ``factory`` when a saved model names it.

    Takes the function (usable as a decorator) or its ``'package.module:function'`` path and
    returns it unchanged.

    Examples:
        >>> @trust_factory                                     # doctest: +SKIP
        ... def make_net(hidden=32): ...
        >>> PipelineModel.load("/models/churn")                # doctest: +SKIP
    """
    path = factory if isinstance(factory, str) else factory_path(factory)
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise ConfigError(f"trust_factory takes a function or 'package.module:function'; got {factory!r}.")
    with _TRUSTED_LOCK:
        _TRUSTED.add(path)
    return factory


def _is_trusted(path: str, extra: Iterable[str] = ()) -> bool:
    with _TRUSTED_LOCK:
        return path in _TRUSTED or path in set(extra)


def _p(name: str, doc: str, conv) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


class _SparkdpParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasSeed):
    """Params shared by :class:`Estimator` and :class:`Model`."""

    model = _p("model", "built-in model name (sparkdp.models.MODELS)", TypeConverters.toString)
    modelKwargs = _p("modelKwargs", "JSON object of keyword arguments for the model", TypeConverters.toString)
    moduleFactory = _p(
        "moduleFactory",
        "import path 'package.module:function' of a function returning "
        "the torch.nn.Module (instead of model)",
        TypeConverters.toString,
    )
    featureShape = _p("featureShape", "per-row feature shape, e.g. [1, 28, 28]", TypeConverters.toListInt)
    probabilityCol = _p(
        "probabilityCol", "column for class probabilities ('' for none)", TypeConverters.toString
    )
    outputType = _p("outputType", "prediction output: auto, class, value or raw", TypeConverters.toString)
    strategy = _p("strategy", "training strategy name (allreduce, average, ...)", TypeConverters.toString)
    strategyOptions = _p("strategyOptions", "JSON object of strategy options", TypeConverters.toString)
    workers = _p("workers", "number of Spark tasks to train on (0: every task slot)", TypeConverters.toInt)
    epochs = _p("epochs", "passes over the data", TypeConverters.toInt)
    batchSize = _p("batchSize", "rows per worker per step (also the inference batch)", TypeConverters.toInt)
    optimizer = _p("optimizer", "optimizer name (sgd, adam, ...)", TypeConverters.toString)
    learningRate = _p("learningRate", "learning rate", TypeConverters.toFloat)
    loss = _p("loss", "loss name (cross_entropy, mse, ...)", TypeConverters.toString)
    dropNulls = _p(
        "dropNulls", "drop rows with null features/labels instead of failing", TypeConverters.toBoolean
    )
    shuffleBuffer = _p("shuffleBuffer", "rows held by each worker's shuffle buffer", TypeConverters.toInt)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            featuresCol="features",
            labelCol="label",
            predictionCol="prediction",
            modelKwargs="{}",
            probabilityCol="",
            outputType="auto",
            strategy="allreduce",
            strategyOptions="{}",
            workers=0,
            epochs=1,
            batchSize=64,
            optimizer="sgd",
            learningRate=0.01,
            loss="cross_entropy",
            dropNulls=False,
            shuffleBuffer=10_000,
            seed=0,
        )

    def _features(self) -> str | list[str]:
        """``featuresCol``; a comma-separated value names several (scalar/array) columns."""
        value = self.getOrDefault(self.featuresCol)
        parts = [c.strip() for c in value.split(",")]
        return parts[0] if len(parts) == 1 else parts

    def _shape(self) -> list[int] | None:
        return self.getOrDefault(self.featureShape) if self.isDefined(self.featureShape) else None

    def _json(self, param: Param) -> dict[str, Any]:
        text = self.getOrDefault(param)
        try:
            value = json.loads(text or "{}")
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{param.name} must be a JSON object; got {text!r} ({exc}).") from exc
        if not isinstance(value, dict):
            raise ConfigError(
                f"{param.name} must be a JSON object such as '{{\"num_classes\": 3}}'; got {text!r}."
            )
        return value

    def _trust_given_factory(self, kwargs: dict[str, Any]) -> None:
        """A factory named in this process's own code (constructor, setParams) is the user's choice."""
        if kwargs.get("moduleFactory"):
            trust_factory(kwargs["moduleFactory"])

    def _build_module(self, trusted: Iterable[str] = (), where: str = "") -> nn.Module:
        if self.isDefined(self.moduleFactory) and self.getOrDefault(self.moduleFactory):
            path = self.getOrDefault(self.moduleFactory)
            if not _is_trusted(path, trusted):
                how = (
                    f"pass it explicitly: Model.load(path, trusted_factories=[{path!r}]), or register it "
                    "before loading"
                    if where
                    else "register it before fitting"
                )
                raise ConfigError(
                    f"{where or 'these params (loaded or copied, not set in this process)'} name moduleFactory "
                    f"{path!r}, which this process has not been told to trust: this would import and call it, "
                    "and saved metadata may have been edited by anyone who could write the files. If you trust "
                    f"it, {how} with sparkdp.ml.trust_factory({path!r}) (or @trust_factory on the function). "
                    "Built-in model names (model=...) need no trust."
                )
            return _factory(path)(**self._json(self.modelKwargs))
        if not self.isDefined(self.model):
            raise ConfigError(
                "no network given: set model= to a built-in name (see sparkdp.models.MODELS) "
                "or moduleFactory='package.module:function'."
            )
        return _built_in(self.getOrDefault(self.model), self._json(self.modelKwargs))


def _built_in(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """Built-in model ``name``, once its size with ``kwargs`` is known to be within ``MAX_BUILTIN_PARAMETERS``:
    it is first built on PyTorch's meta device, which records shapes and allocates nothing."""
    import torch

    from ..models import MODELS

    for key, value in kwargs.items():
        if not isinstance(value, (int, float, str)):
            raise ConfigError(
                f"modelKwargs {key!r} of the built-in model {name!r} is {json.dumps(value)[:60]}; "
                "built-in models take numbers (and strings) only."
            )
    try:
        with torch.device("meta"):
            shapes = MODELS.create(name, **kwargs)
        count = sum(p.numel() for p in shapes.parameters())
    except ConfigError:
        raise
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise ConfigError(
            f"the built-in model {name!r} cannot be built with modelKwargs {json.dumps(kwargs)[:200]}: "
            f"{exc}. Give positive sizes its factory takes (see sparkdp.models.MODELS)."
        ) from exc
    if count > MAX_BUILTIN_PARAMETERS:
        raise ConfigError(
            f"modelKwargs {json.dumps(kwargs)[:200]} give the built-in model {name!r} {count:,} parameters "
            f"({count * 4 / 2**30:,.0f} GiB of float32), more than sparkdp.spark.ml.MAX_BUILTIN_PARAMETERS "
            f"({MAX_BUILTIN_PARAMETERS:,}); refused before allocating. Check the model's saved params (its "
            "metadata may have been edited), or give a network that large as a trusted moduleFactory."
        )
    return MODELS.create(name, **kwargs)


def _factory(path: str) -> Callable[..., nn.Module]:
    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"moduleFactory {path!r} cannot be imported ({exc}); give 'package.module:function' "
            "of a function importable on the driver and the executors."
        ) from exc
    if not callable(fn):
        raise ConfigError(f"moduleFactory {path!r} is not callable.")
    return fn


def factory_path(fn: Callable[..., nn.Module]) -> str:
    """``'module:qualname'`` of an importable module-level function (what ``moduleFactory`` takes)."""
    path = f"{fn.__module__}:{fn.__qualname__}"
    if "<" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ConfigError(
            f"the factory {path} cannot be re-imported when a saved model is loaded; define it "
            "at module level in an importable module, or use a built-in model name."
        )
    return path


class EstimatorBase(SparkEstimator, _SparkdpParams, DefaultParamsReadable, DefaultParamsWritable):
    """``sparkdp.ml.Estimator`` but for the training call: this package is the adapter below the
    driver, so the Estimator that calls ``sparkdp.fit`` is defined in :mod:`sparkdp.ml` and hands
    it to :meth:`_fit_with`."""

    _input_kwargs: dict[str, Any]  # set by pyspark's @keyword_only

    @keyword_only
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._trust_given_factory(self._input_kwargs)
        self._set(**self._input_kwargs)

    @keyword_only
    def setParams(self, **kwargs: Any) -> EstimatorBase:
        self._trust_given_factory(self._input_kwargs)
        return self._set(**self._input_kwargs)

    @classmethod
    def read(cls) -> _CheckedReader:
        return _CheckedReader(cls)

    def _fit_with(self, fit: Callable[..., Any], dataset) -> Model:
        """Train on ``dataset`` with ``fit`` (``sparkdp.fit``) and return the trained Model."""
        net = self._build_module()
        workers = self.getOrDefault(self.workers) or None
        label = self.getOrDefault(self.labelCol)
        if self.getOrDefault(self.loss) in ("cross_entropy", "nll") and dict(dataset.dtypes).get(label) in (
            "double",
            "float",
        ):
            # Spark ML's own stages (StringIndexer, ...) write class indices as doubles
            from pyspark.sql import functions as F

            dataset = dataset.withColumn(label, F.col(label).cast("long"))
        result = fit(
            net,
            dataset,
            features=self._features(),
            label=label,
            feature_shape=self._shape(),
            drop_nulls=self.getOrDefault(self.dropNulls),
            shuffle_buffer=self.getOrDefault(self.shuffleBuffer),
            loss=self.getOrDefault(self.loss),
            optimizer=self.getOrDefault(self.optimizer),
            optimizer_options={"lr": self.getOrDefault(self.learningRate)},
            strategy=self.getOrDefault(self.strategy),
            strategy_options=self._json(self.strategyOptions),
            workers=workers,
            epochs=self.getOrDefault(self.epochs),
            batch_size=self.getOrDefault(self.batchSize),
            seed=self.getOrDefault(self.seed),
            spark=dataset.sparkSession,
            show_progress=False,
        )
        model = Model()
        self._copyValues(model)
        model.module = result.model
        model.history = result.history
        return model


class Model(SparkModel, _SparkdpParams, DefaultParamsReadable, DefaultParamsWritable):
    """A trained network as a Transformer: ``transform(df)`` adds ``predictionCol`` (and ``probabilityCol``)."""

    def __init__(self) -> None:
        super().__init__()
        self.module: nn.Module | None = None
        self.history: list[dict[str, float]] = []

    def _transform(self, dataset):
        if self.module is None:
            raise ConfigError(
                "this Model holds no trained network; obtain it from Estimator.fit or Model.load."
            )
        prob = self.getOrDefault(self.probabilityCol) or None
        return predict(
            self.module,
            dataset,
            features=self._features(),
            feature_shape=self._shape(),
            output_col=self.getOrDefault(self.predictionCol),
            batch_size=self.getOrDefault(self.batchSize),
            output="class" if prob else self.getOrDefault(self.outputType),
            probability_col=prob,
        )

    def write(self) -> _ModelWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> _ModelReader:
        return _ModelReader(cls)

    @classmethod
    def load(cls, path: str, trusted_factories: Iterable[Callable[..., nn.Module] | str] = ()) -> Model:
        """Load a saved Model; a ``moduleFactory`` it names is called only if trusted (module docstring)."""
        return cls.read().trusting(trusted_factories).load(path)


def _local(path: str) -> str:
    return path[len("file:") :] if path.startswith("file:") else path


class _ModelWriter(DefaultParamsWriter):
    """Spark's params metadata, plus the network as safetensors and its description as JSON."""

    def saveImpl(self, path: str) -> None:
        super().saveImpl(path)
        model = cast(Model, self.instance)  # the writer Model.write() made
        if model.module is None:
            raise ConfigError("cannot save a Model without a trained network.")
        folder = _local(path)
        os.makedirs(folder, exist_ok=True)
        save_state(model.module.state_dict(), os.path.join(folder, _MODULE_FILE))
        desc = {
            "format": "sparkdp-model/1",
            "history": model.history,
            "module_class": f"{type(model.module).__module__}.{type(model.module).__qualname__}",
        }
        with open(os.path.join(folder, _DESC_FILE), "w") as f:
            json.dump(desc, f, indent=2)


class _CheckedReader(DefaultParamsReader):
    """Spark's params reader without its one unsafe step: ``DefaultParamsReader.load`` imports the
    class the metadata names and calls it, so an edited ``"class"`` would run code on load. This
    reader builds the class it reads for, after checking the metadata names that class."""

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"  # what DefaultParamsWriter records
        if metadata.get("class") != expected:
            raise ConfigError(
                f"the saved params at {path} are for class {metadata.get('class')!r}, not "
                f"{expected!r}: load them with that class's own load(), or check the directory."
            )
        instance: Any = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance


class _ModelReader(_CheckedReader):
    def __init__(self, cls: type) -> None:
        super().__init__(cls)
        self._trusted: tuple[str, ...] = ()

    def trusting(self, factories: Iterable[Callable[..., nn.Module] | str]) -> _ModelReader:
        self._trusted = tuple(f if isinstance(f, str) else factory_path(f) for f in factories)
        return self

    def load(self, path: str) -> Model:
        model = super().load(path)
        folder = _local(path)
        with open(os.path.join(folder, _DESC_FILE)) as f:
            desc = json.load(f)
        # from the saved params: model/moduleFactory + modelKwargs; a factory only if trusted
        net = model._build_module(self._trusted, where=f"the saved model at {path}")
        net.load_state_dict(load_state(os.path.join(folder, _MODULE_FILE)))
        model.module = net.eval()
        model.history = desc.get("history", [])
        return model


__all__ = ["EstimatorBase", "Model", "factory_path", "trust_factory"]
