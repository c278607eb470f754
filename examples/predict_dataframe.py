"""Batch inference on a Spark DataFrame with ``sparkdp.predict``.

Shows scoring any trained ``nn.Module`` against a DataFrame: ``predict`` ships the model once
per Python worker (weights as safetensors, no pickled tensors), feeds it Arrow batches of the
feature column and appends a ``prediction`` column (the class index for a classifier) and,
on request, class probabilities. All other columns are kept, so results join back by id.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/predict_dataframe.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/predict_dataframe.py   # a quick smoke run
"""

import os
import sys

import pandas as pd
import pyspark.sql.functions as F
import torch
import torch.nn.functional as nnf
from torch import nn

import sparkdp
from sparkdp.data.datasets import FASHION_MNIST_CLASSES, fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def quick_model(x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    # Any trained module will do (from sparkdp.fit, or loaded from a file); one quick
    # epoch of plain PyTorch on the driver keeps this example about inference.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(0, len(x), 32):
        optimizer.zero_grad()
        nnf.cross_entropy(model(x[i : i + 32]), y[i : i + 32]).backward()
        optimizer.step()
    return model


def main() -> None:
    data = fashion_mnist(limit=ROWS)
    model = quick_model(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))

    spark = sparkdp.session()
    rows = pd.DataFrame(
        {"id": range(len(data.y_test)), "pixels": list(data.x_test.reshape(-1, 784)), "label": data.y_test}
    )
    df = spark.createDataFrame(rows, "id long, pixels array<float>, label long")

    # feature_shape is not needed: the model flattens. A CNN would take feature_shape=(1, 28, 28).
    scored = sparkdp.predict(model, df, features="pixels", output="class", probability_col="probability")
    # Spark evaluates lazily: cache() keeps the model from running again for every query below.
    scored = scored.withColumn("correct", (F.col("prediction") == F.col("label")).cast("int")).cache()

    per_class = scored.groupBy("label").agg(F.count("*").alias("n"), F.sum("correct").alias("ok")).collect()
    total, correct = sum(r["n"] for r in per_class), sum(r["ok"] for r in per_class)
    accuracy = correct / total
    scored.select("id", "label", "prediction", F.array_max("probability").alias("confidence")).show(5)
    worst = min(per_class, key=lambda r: r["ok"] / r["n"])
    print(f"hardest class: {FASHION_MNIST_CLASSES[worst['label']]} ({worst['ok'] / worst['n']:.2f})")
    print(f"predict_dataframe: {total} rows scored, accuracy {accuracy:.3f}")
    if total != len(data.y_test) or accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"predict_dataframe: {total} rows, accuracy {accuracy:.3f}: inference is broken")


if __name__ == "__main__":
    main()
