"""Train from a Spark DataFrame / Parquet files: ``fit(data, features=..., label=...)``.

Shows the columnar path: a DataFrame of Fashion-MNIST rows (an ``array<float>`` pixel column
and an integer label) is written to Parquet with ``sparkdp.session()``; ``fit`` then trains
on it, naming the columns and reshaping each row with ``feature_shape``. A DataFrame that is a
plain Parquet scan, or a Parquet path, is read by the workers straight from the files; other
DataFrames are streamed through Spark, one stage per epoch.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/dataframe_parquet.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/dataframe_parquet.py   # a quick smoke run
"""

import os
import sys
import tempfile

import pandas as pd
import torch
from torch import nn

import sparkdp
from sparkdp.data.datasets import fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def write_parquet(spark, x, y, path: str) -> None:
    # Stand-in for the table you already have: one row per image, pixels flattened.
    frame = pd.DataFrame({"pixels": list(x.reshape(len(x), -1)), "label": y})
    spark.createDataFrame(frame, "pixels array<float>, label long").write.parquet(path)


def main() -> None:
    spark = sparkdp.session()  # the embedded local[N] session fit() would start anyway
    data = fashion_mnist(limit=ROWS)
    with tempfile.TemporaryDirectory() as tmp:
        train_path, test_path = os.path.join(tmp, "train.parquet"), os.path.join(tmp, "test.parquet")
        write_parquet(spark, data.x_train, data.y_train, train_path)
        write_parquet(spark, data.x_test, data.y_test, test_path)

        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 14 * 14, 10),
        )
        # data may be the DataFrame or the path; eval_data takes a Parquet path (or a plain scan).
        result = sparkdp.fit(
            model,
            spark.read.parquet(train_path),
            eval_data=test_path,
            features="pixels",
            label="label",
            feature_shape=(1, 28, 28),
            optimizer="sgd",
            optimizer_options={"lr": 0.05},
            workers=2,
            epochs=1,
            batch_size=32,
            show_progress=False,
        )
    accuracy = result.test_accuracy
    print(f"trained on {result.samples} rows in {result.train_time_s:.1f} s")
    print(f"dataframe_parquet: test accuracy {accuracy:.3f}")
    if accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"dataframe_parquet: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
