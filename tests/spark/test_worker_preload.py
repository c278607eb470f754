"""The preload variable a DataFrame function carries to its worker daemon: set only inside
``preloading`` and restored after it, and read by the daemon as a fixed list of modules."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from sparkdp.spark.worker_preload import PRELOAD_ENV, PRELOADS, preload, preloading

pytestmark = pytest.mark.timeout(120)


def test_the_variable_is_set_inside_the_block_only_and_what_was_there_comes_back():
    environment: dict[str, str] = {"OTHER": "1"}
    session = SimpleNamespace(sparkContext=SimpleNamespace(environment=environment))
    with preloading(session, "transformers"):
        assert environment == {"OTHER": "1", PRELOAD_ENV: "transformers"}
    assert environment == {"OTHER": "1"}
    environment[PRELOAD_ENV] = "mine"
    with pytest.raises(RuntimeError), preloading(session, "transformers"):
        raise RuntimeError("the function could not be made")
    assert environment[PRELOAD_ENV] == "mine"
    with preloading(SimpleNamespace(), "transformers"):  # no SparkContext (Spark Connect): nothing to set
        pass


def test_the_daemon_imports_the_named_lists_only():
    pytest.importorskip("transformers")
    code = (
        "import sys\n"
        "from sparkdp.spark.worker_preload import preload\n"
        "preload('json, nothing-such')\n"
        "assert 'transformers' not in sys.modules\n"
        "preload('transformers')\n"
        f"assert all(m in sys.modules for m in {list(PRELOADS['transformers'])!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    preload("")  # nothing named: nothing imported, no error
