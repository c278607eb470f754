"""The examples in sparkdp's docstrings run (``doctest``), those with Spark on the tests'
local session. The few still marked ``+SKIP`` need a dataset or a long job; the same calls run
in ``examples/`` (``tests/examples``)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(
    ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
    for p in (SRC / "sparkdp").rglob("*.py")
    if ">>> " in p.read_text()
)
pytestmark = pytest.mark.timeout(180)


def test_the_modules_with_examples_are_found():
    assert {"sparkdp.driver.api", "sparkdp.spark.predict", "sparkdp.caffe.weights"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, spark):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} docstring examples in {name} failed (above)"
    )
