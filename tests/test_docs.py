"""The user guide builds with no warning: every page, internal link and anchor, API reference
and included example resolves (``mkdocs build --strict``, as ``make docs``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def _build(site: Path, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_guide_builds_strictly_and_shows_the_cli_and_the_examples(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    built = _build(tmp_path / "site")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("sparkdp train", "sparkdp launch", "sparkdp report", "sparkdp caffe inspect"):
        assert command in cli
    assert "--strategy-option" in cli and "--min-workers" in cli  # generated from the parsers
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "sparkdp.fit" in api and "WorkerFailed" in api and "Estimator" in api
    guide = (tmp_path / "site" / "guide" / "your-script" / "index.html").read_text()
    assert "sparkdp.distribute" in guide and "addArchive" in guide  # the page's own text and its examples
    bench = (tmp_path / "site" / "benchmarks" / "index.html").read_text()
    assert "sync_vs_torchdistributor.py" in bench and "TorchDistributor" in bench  # the performance record


def test_a_broken_link_fails_the_build_with_the_page(tmp_path):
    """A copy of the docs with one broken link: the build fails and names the page."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("docs", "examples", "scripts", "src"):
        shutil.copytree(ROOT / name, copy / name)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "guide" / "security.md"
    page.write_text(page.read_text() + "\nSee [the missing page](nowhere.md).\n")
    built = _build(tmp_path / "site", root=copy)
    assert built.returncode != 0
    assert "guide/security.md" in built.stdout + built.stderr and "nowhere.md" in built.stdout + built.stderr
