"""Spark ML Pipeline stages: ``sparkdp.ml.Estimator`` and ``sparkdp.ml.Model``.

Importing this module imports pyspark (the Spark side lives in :mod:`sparkdp.spark.ml`, the one
package that talks to Spark); ``import sparkdp`` alone does not. The Estimator is defined here,
above both layers, because it calls the driver's ``fit``: :mod:`sparkdp.spark` never imports
the driver.
"""

from __future__ import annotations

from typing import Any

from .driver.api import fit
from .spark.ml import EstimatorBase, Model, factory_path, trust_factory


class Estimator(EstimatorBase):
    """Trains a torch network on a DataFrame with sparkdp; ``fit`` returns a :class:`Model`.

    Examples:
        >>> est = Estimator(model="linear", modelKwargs='{"image_size": 2, "num_classes": 3}',
        ...                 featuresCol="features", epochs=2, workers=2)   # doctest: +SKIP
        >>> Pipeline(stages=[VectorAssembler(...), est]).fit(df)          # doctest: +SKIP
    """

    def _fit(self, dataset: Any) -> Model:
        return self._fit_with(fit, dataset)


__all__ = ["Estimator", "Model", "factory_path", "trust_factory"]
