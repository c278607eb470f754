"""What session() logs about the Spark it connects to hides the credentials in the URL (no Spark started)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.timeout(30)


class _Builder:
    """Stands in for PySpark's Connect builder: records the URL, connects nowhere."""

    def __init__(self) -> None:
        self.url: str | None = None

    def remote(self, url: str) -> _Builder:
        self.url = url
        return self

    def appName(self, _name: str) -> _Builder:  # noqa: N802 - PySpark's spelling
        return self

    def config(self, map: dict) -> _Builder:  # noqa: A002 - PySpark's keyword
        return self

    def getOrCreate(self) -> str:  # noqa: N802
        return "session"


@pytest.mark.parametrize("how", ["master", "remote", "environment"])
def test_a_spark_connect_token_is_not_logged(how, monkeypatch, caplog):
    import importlib

    import pyspark.sql.connect.session as connect

    session_module = importlib.import_module(
        "sparkdp.spark.session"
    )  # the package's `session` is the function

    builder = _Builder()
    monkeypatch.setattr(connect.SparkSession, "builder", builder)
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "")  # restored afterwards: session() sets it
    url = "sc://spark.example:15002/;use_ssl=true;token=s3cr3t-t0k3n;x-api-secret=h34der"
    kwargs = {"master": {"master": url}, "remote": {"remote": url}, "environment": {}}[how]
    if how == "environment":
        monkeypatch.setenv("SPARK_REMOTE", url)
    with caplog.at_level(logging.DEBUG, logger="sparkdp"):
        assert session_module.session(**kwargs) == "session"
    assert builder.url == url  # the client still gets the whole URL
    assert (
        "connecting to Spark Connect at sc://spark.example:15002/;use_ssl=true;token=***;x-api-secret=***"
        in caplog.text
    )
    assert "s3cr3t" not in caplog.text and "h34der" not in caplog.text
