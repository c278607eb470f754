"""The warm-up job's task environment: what Spark's DataFrame runners add, under the settings
that turn each variable on (their defaults when unset). The real runner's agreement is checked in
tests/spark/test_launcher.py (one daemon for the warm-up and the stages)."""

from __future__ import annotations

import pytest

from sparkdp.spark.warm_up import dataframe_worker_env

pytestmark = pytest.mark.timeout(10)

UDF = "spark.sql.execution.pyspark.udf."


def test_spark_defaults_add_the_simplified_traceback_only():
    assert dataframe_worker_env({}) == {"SPARK_SIMPLIFIED_TRACEBACK": "1"}


def test_each_setting_turns_its_own_variable_on_or_off():
    conf = {
        f"{UDF}simplifiedTraceback.enabled": "false",
        f"{UDF}hideTraceback.enabled": "True",
        f"{UDF}tracebackWithLocals.enabled": " true ",
    }
    assert dataframe_worker_env(conf) == {"SPARK_HIDE_TRACEBACK": "1", "SPARK_TRACEBACK_WITH_LOCALS": "1"}
