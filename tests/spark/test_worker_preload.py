"""The preload variable a DataFrame function carries to its worker daemon: set only inside
``preloading`` and restored after it, and read by the daemon as a fixed list of modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
import zipimport
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


def test_the_daemon_imports_the_named_lists_only_and_forks_with_no_new_thread():
    pytest.importorskip("transformers")
    code = (
        "import os, sys\n"
        "from sparkdp.spark.worker_preload import preload\n"
        "preload('json, nothing-such')\n"
        "assert 'transformers' not in sys.modules\n"
        "threads = len(os.listdir('/proc/self/task'))\n"
        "preload('transformers')\n"
        f"assert all(m in sys.modules for m in {list(PRELOADS['transformers'])!r})\n"
        # the warm-up filled from_pretrained's table (None until a process's first model load)
        "from transformers import conversion_mapping\n"
        "assert getattr(conversion_mapping, '_checkpoint_conversion_mapping_cache', 'gone') is not None\n"
        # what the daemon imports besides (sparkdp.spark.daemon's __main__) starts no thread either
        "from sparkdp.spark.daemon import worker_module\n"
        "import importlib; importlib.import_module(worker_module())\n"
        "assert len(os.listdir('/proc/self/task')) == threads, os.listdir('/proc/self/task')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    preload("")  # nothing named: nothing imported, no error


def test_the_daemon_drops_its_zip_importers_and_imports_from_the_zip_still_work(tmp_path, monkeypatch):
    """A worker's ``importlib.invalidate_caches()`` makes every cached zip importer re-read its
    archive: the daemon leaves none cached, and the import system makes a new one when asked."""
    from sparkdp.spark.daemon import forget_zip_importers

    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_pkg/__init__.py", "")
        z.writestr("zipped_pkg/first.py", "VALUE = 1\n")
        z.writestr("zipped_pkg/second.py", "VALUE = 2\n")
    monkeypatch.syspath_prepend(str(archive))
    for name in ("zipped_pkg", "zipped_pkg.first", "zipped_pkg.second"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    first = importlib.import_module("zipped_pkg.first")
    zipped = [p for p, f in sys.path_importer_cache.items() if isinstance(f, zipimport.zipimporter)]
    assert str(archive) in zipped and first.VALUE == 1
    forget_zip_importers()
    assert not [f for f in sys.path_importer_cache.values() if isinstance(f, zipimport.zipimporter)]
    assert importlib.import_module("zipped_pkg.second").VALUE == 2
    for name in ("zipped_pkg", "zipped_pkg.first", "zipped_pkg.second"):
        sys.modules.pop(name, None)


def test_the_daemon_preloads_the_worker_module_pyspark_daemon_would_import(monkeypatch):
    from sparkdp.spark.daemon import worker_module

    monkeypatch.setattr(sys, "argv", ["daemon.py"])
    assert worker_module() == "pyspark.worker"
    monkeypatch.setattr(sys, "argv", ["daemon.py", "pyspark.worker_custom"])
    assert worker_module() == "pyspark.worker_custom"
    monkeypatch.setattr(sys, "argv", ["daemon.py", "not_pyspark.worker"])  # pyspark.daemon ignores it too
    assert worker_module() == "pyspark.worker"
