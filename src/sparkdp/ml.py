"""Spark ML Pipeline stages: ``sparkdp.ml.Estimator`` and ``sparkdp.ml.Model``.

Importing this module imports pyspark (the implementation lives in
:mod:`sparkdp.spark.ml`, the one package that talks to Spark); ``import sparkdp``
alone does not.
"""

from .spark.ml import Estimator, Model, factory_path, trust_factory

__all__ = ["Estimator", "Model", "factory_path", "trust_factory"]
