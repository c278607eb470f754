"""sparkdp inside a Spark ML ``Pipeline``: ``sparkdp.ml.Estimator`` -> fit, save, load, transform.

Shows the Spark ML integration: a pipeline turns the class names of Fashion-MNIST rows into
label indices (``StringIndexer``) and trains sparkdp's built-in ``cnn-small`` network on the
pixel column with ``sparkdp.ml.Estimator``. The fitted ``PipelineModel`` saves as Spark's
metadata plus safetensors (no pickles), loads back in a fresh ``PipelineModel.load`` and
scores test rows with ``transform``.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/ml_pipeline.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/ml_pipeline.py   # a quick smoke run
"""

import json
import os
import sys
import tempfile

import pandas as pd
import pyspark.sql.functions as F
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.feature import StringIndexer

import sparkdp
from sparkdp.data.datasets import FASHION_MNIST_CLASSES, fashion_mnist
from sparkdp.ml import Estimator

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def rows(spark, x, y):
    names = [FASHION_MNIST_CLASSES[i] for i in y]  # tables usually hold names, not indices
    frame = pd.DataFrame({"pixels": list(x.reshape(len(x), -1)), "class": names})
    return spark.createDataFrame(frame, "pixels array<float>, class string")


def main() -> None:
    spark = sparkdp.session()
    data = fashion_mnist(limit=ROWS)
    train_df, test_df = rows(spark, data.x_train, data.y_train), rows(spark, data.x_test, data.y_test)

    # StringIndexer writes class indices as doubles; the Estimator reads them as classes
    # for its cross-entropy loss
    indexer = StringIndexer(inputCol="class", outputCol="label")
    estimator = Estimator(
        model="cnn-small",
        modelKwargs=json.dumps({"num_classes": 10}),
        featuresCol="pixels",
        labelCol="label",
        featureShape=[1, 28, 28],
        probabilityCol="probability",
        optimizer="adam",
        learningRate=0.002,
        epochs=1,
        batchSize=32,
        workers=2,
    )
    fitted = Pipeline(stages=[indexer, estimator]).fit(train_df)
    print("training history:", fitted.stages[-1].history)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fashion_pipeline")
        fitted.write().overwrite().save(path)
        loaded = PipelineModel.load(path)  # rebuilds cnn-small from its name and the saved weights
        scored = loaded.transform(test_df)
        correct = scored.agg(F.avg((F.col("prediction") == F.col("label")).cast("double"))).first()[0]

    print(f"ml_pipeline: test accuracy {correct:.3f}")
    if correct < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"ml_pipeline: accuracy {correct:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
