"""fit on Spark DataFrames and Parquet paths: streamed, uneven partitions, bad input."""

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import sparkdp
from sparkdp.data.parquet import ParquetData
from sparkdp.errors import DataError
from sparkdp.spark.dataframe import DataFrameSource, dataframe_data, parquet_scan_files

pytestmark = pytest.mark.spark

W_TRUE, B_TRUE = np.array([1.5, -2.0, 0.5], np.float32), 0.3


def _rows(n=1200, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    return x, (x @ W_TRUE + B_TRUE).astype(np.float32)


def _mse(out, target):
    return nn.functional.mse_loss(out.squeeze(1), target)


def _fit(data, spark, epochs=3, **kw):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    result = sparkdp.fit(
        model,
        data,
        loss=_mse,
        workers=2,
        epochs=epochs,
        batch_size=16,
        spark=spark,
        optimizer_options={"lr": 0.05},
        show_progress=False,
        **kw,
    )
    return model, result


def _assert_learned(model, tol=0.05):
    np.testing.assert_allclose(model.weight.detach().numpy()[0], W_TRUE, atol=tol)
    assert abs(model.bias.item() - B_TRUE) < tol


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    x, y = _rows()
    path = tmp_path_factory.mktemp("pq")
    table = pa.table(
        {"x": pa.array(list(x), type=pa.list_(pa.float32())), "y": y, "other": np.arange(len(y))}
    )
    pq.write_table(table.slice(0, 700), path / "part-0.parquet", row_group_size=200)
    pq.write_table(table.slice(700), path / "part-1.parquet", row_group_size=128)
    return path


def test_fit_on_parquet_path_learns_linear(parquet_dir, spark, caplog):
    with caplog.at_level(logging.INFO, logger="sparkdp"):
        model, result = _fit(str(parquet_dir), spark, features="x", label="y")
    _assert_learned(model)
    assert [h["samples"] for h in result.history] == [1200] * 3
    assert any(
        "data columns -> tensors: features float32 (batch, 3) <- 'x'" in r.getMessage()
        for r in caplog.records
    )


def test_fit_on_streamed_dataframe_learns_linear(spark, caplog):
    x, y = _rows(seed=1)
    df = (
        spark.createDataFrame(
            [(float(a), float(b), float(c), float(t)) for (a, b, c), t in zip(x, y, strict=True)],
            ["a", "b", "c", "y"],
        )
        .repartition(2)
        .cache()
    )
    try:
        with caplog.at_level(logging.INFO, logger="sparkdp"):
            model, result = _fit(df, spark, epochs=2, features=["a", "b", "c"], label="y")
    finally:
        df.unpersist()
    _assert_learned(model, tol=0.1)
    assert [h["epoch"] for h in result.history] == [1, 2]
    assert result.history[1]["loss"] < result.history[0]["loss"]


def test_plain_parquet_scans_are_read_directly(parquet_dir, spark):
    scan = spark.read.parquet(str(parquet_dir)).select("x", "y")
    assert len(parquet_scan_files(scan)) == 2
    assert isinstance(dataframe_data(scan, features="x", label="y"), ParquetData)
    for derived in (scan.filter("y > 0"), scan.selectExpr("x", "y * 2 AS y")):
        assert parquet_scan_files(derived) is None
        assert isinstance(dataframe_data(derived, features="x", label="y"), DataFrameSource)


def _indexed(spark, frame):
    """x = [id / 100], y = 2 x - 1 over a DataFrame of ids (partitioning kept)."""
    return frame.selectExpr("array(CAST(id / 100.0 AS FLOAT)) AS x", "CAST(2 * id / 100.0 - 1 AS FLOAT) AS y")


@pytest.mark.parametrize(
    "name,make",
    [
        ("5 partitions, 3 empty", lambda s: s.range(0, 200, 1, 5).filter("id < 80")),
        ("1 partition, 2 workers", lambda s: s.range(0, 60, 1, 1)),
        ("2 partitions, 1 empty", lambda s: s.range(0, 100, 1, 2).filter("id < 50")),
    ],
)
def test_uneven_and_empty_partitions_train_without_deadlock(spark, name, make):
    df = _indexed(spark, make(spark))
    model = nn.Linear(1, 1)
    result = sparkdp.fit(
        model,
        df,
        features="x",
        label="y",
        loss=_mse,
        workers=2,
        epochs=1,
        batch_size=8,
        spark=spark,
        show_progress=False,
        start_timeout_s=60,
        pg_timeout_s=60,
    )
    assert result.history[0]["samples"] > 0, name


def test_drop_nulls_reports_count(spark, caplog):
    df = spark.range(0, 40, 1, 2).selectExpr(
        "IF(id % 10 = 3, NULL, array(CAST(id / 40.0 AS FLOAT))) AS x", "CAST(id / 40.0 AS FLOAT) AS y"
    )
    with caplog.at_level(logging.INFO, logger="sparkdp"):
        sparkdp.fit(
            nn.Linear(1, 1),
            df,
            features="x",
            label="y",
            drop_nulls=True,
            loss=_mse,
            workers=2,
            epochs=1,
            batch_size=8,
            spark=spark,
            show_progress=False,
        )
    assert any("dropped 4 row(s) with null features or labels" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ bad input
def _classes_df(spark, labels):
    rows = [([float(i), 1.0], int(lab)) for i, lab in enumerate(labels)]
    return spark.createDataFrame(rows, ["x", "label"])


def test_missing_column_lists_available(spark):
    df = _classes_df(spark, [0, 1])
    with pytest.raises(
        DataError, match=r"column\(s\) \['pixels'\] not in the DataFrame. Available columns: x, label"
    ):
        sparkdp.fit(nn.Linear(2, 2), df, features="pixels", label="label", workers=2, spark=spark)


def test_unsupported_column_type(spark):
    df = spark.createDataFrame([("a", 1)], ["s", "label"])
    with pytest.raises(
        DataError, match=r"column 's' has type string, which cannot become a tensor. Supported"
    ):
        sparkdp.fit(nn.Linear(2, 2), df, features="s", label="label", workers=2, spark=spark)


def test_empty_dataframe(spark):
    df = _classes_df(spark, [0, 1]).filter("label > 5")
    with pytest.raises(DataError, match="the DataFrame is empty"):
        sparkdp.fit(nn.Linear(2, 2), df, features="x", label="label", workers=2, spark=spark)


def test_null_without_drop_nulls_fails_on_the_driver(spark):
    df = spark.createDataFrame([([1.0, 2.0], None), ([1.0, 2.0], 1)], "x array<double>, label int")
    with pytest.raises(DataError, match=r"label column 'label' has a null value.*drop_nulls=True"):
        sparkdp.fit(nn.Linear(2, 2), df, features="x", label="label", workers=2, spark=spark)


def test_label_out_of_range_fails_at_the_bad_batch_in_a_worker(spark):
    df = _classes_df(spark, [0, 1] * 20 + [7] + [0, 1] * 20).coalesce(1)
    with pytest.raises(DataError, match=r"label column 'label' has label 7 .* model has 2 outputs"):
        sparkdp.fit(
            nn.Linear(2, 2),
            df,
            features="x",
            label="label",
            workers=2,
            epochs=1,
            batch_size=4,
            spark=spark,
            show_progress=False,
        )


def test_ragged_arrays_against_feature_shape(spark, tmp_path):
    table = pa.table({"x": pa.array([[1.0, 2.0, 3.0, 4.0]] * 3 + [[1.0, 2.0]]), "label": [0, 1, 0, 1]})
    pq.write_table(table, tmp_path / "r.parquet")
    with pytest.raises(
        DataError,
        match=r"column 'x' is ragged: row \d+ of this worker's data holds 2 values, but feature_shape "
        r"\(1, 2, 2\) needs 4",
    ):
        sparkdp.fit(
            nn.Sequential(nn.Flatten(), nn.Linear(4, 2)),
            str(tmp_path),
            features="x",
            label="label",
            feature_shape=(1, 2, 2),
            workers=2,
            epochs=1,
            batch_size=2,
            spark=spark,
            show_progress=False,
        )


def test_the_averaging_period_continues_across_dataframe_epochs(spark):
    """A streamed DataFrame trains one barrier stage per epoch; the strategy's step count (where its
    averaging period stands) travels from stage to stage instead of restarting at 0 every epoch."""
    x, y = _rows(seed=2)
    df = (
        spark.createDataFrame(
            [(float(a), float(b), float(c), float(t)) for (a, b, c), t in zip(x, y, strict=True)],
            ["a", "b", "c", "y"],
        )
        .repartition(2)
        .cache()
    )
    strategy = sparkdp.strategies.ParameterAveraging(period=5)
    try:
        _, result = _fit(df, spark, epochs=2, features=["a", "b", "c"], label="y", strategy=strategy)
    finally:
        df.unpersist()
    per_epoch = -(-600 // 16)  # each rank's 600 rows in batches of 16
    assert result.details["strategy_state"] == {"steps": 2 * per_epoch}, result.history
    assert strategy.state_dict() == {"steps": 0}, "fit advanced the caller's strategy object"


def test_a_dataframes_token_columns_train_a_model_computing_its_own_loss(spark):
    from tests.train.lm_models import TinyCausalLM, token_data

    tokens = token_data(48)
    rows = [
        tuple(tokens[k][i].tolist() for k in ("input_ids", "attention_mask", "labels")) for i in range(48)
    ]
    df = spark.createDataFrame(
        rows, "input_ids array<int>, attention_mask array<int>, labels array<int>"
    ).repartition(2)
    model = TinyCausalLM()
    result = sparkdp.fit(
        model,
        df,
        features=["input_ids", "attention_mask", "labels"],
        dict_batches=True,
        loss="model",
        optimizer="adam",
        optimizer_options={"lr": 0.05},
        workers=2,
        epochs=2,
        batch_size=8,
        spark=spark,
        show_progress=False,
    )
    assert [h["samples"] for h in result.history] == [48, 48]
    assert result.history[1]["loss"] < result.history[0]["loss"]
