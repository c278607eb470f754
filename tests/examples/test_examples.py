"""Every program in examples/ runs as a user runs it: a subprocess, here on a small slice of data.

Each example reads SPARKDP_EXAMPLE_ROWS, trains on 2 workers of the embedded local Spark,
checks its own result (exiting non-zero when it is clearly broken) and ends with one line
naming itself; these tests check the exit status and that line. A new example must be added
to EXAMPLES, which test_every_example_is_tested enforces.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdp.data.text_datasets import FORTUNES_DIR

from ..cli.test_cli import _explain, needs_fashion

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
ROWS = "2000"
# a smaller slice where the example's own check needs no more: 500 cookies make about 480 blocks
# of 128 tokens, enough for the language model's loss to fall over its 2 epochs
ROWS_OF = {"language_model.py": "500"}

# example file -> the start of the last line it prints on success
EXAMPLES = {
    "async_server_optimizer.py": "async_server_optimizer: test accuracy ",
    "caffe_net.py": "caffe_net: test accuracy ",
    "dataframe_parquet.py": "dataframe_parquet: test accuracy ",
    "fit_arrays.py": "fit_arrays: test accuracy ",
    "language_model.py": "language_model: loss ",
    "launch_script.py": "launch_script: test accuracy ",
    "ml_pipeline.py": "ml_pipeline: test accuracy ",
    "predict_dataframe.py": f"predict_dataframe: {ROWS} rows scored, accuracy ",
    "run_distribute.py": "run_distribute: test accuracy ",
}


def _missing_for(name: str) -> str | None:
    """Why an example cannot run here, or None."""
    if name != "language_model.py":
        return None
    if not FORTUNES_DIR.is_dir():
        return "the Debian package `fortunes` is not installed"
    return None


@pytest.mark.e2e
@needs_fashion
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_on_a_small_slice(name, tmp_path):
    if (missing := _missing_for(name)) is not None:
        pytest.skip(missing)
    # cwd=tmp_path: an example that writes into its working directory does not touch the checkout
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES_DIR / name)],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=tmp_path,
        env={**os.environ, "SPARKDP_EXAMPLE_ROWS": ROWS_OF.get(name, ROWS)},
    )
    assert proc.returncode == 0, _explain(proc)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(EXAMPLES[name]), _explain(proc)
    assert not list(tmp_path.iterdir()), f"{name} left files in its working directory"


def test_every_example_is_tested():
    found = {path.name for path in EXAMPLES_DIR.glob("*.py")}
    assert found == set(EXAMPLES), (
        f"examples without a test: {sorted(found - set(EXAMPLES))}; "
        f"tests without an example: {sorted(set(EXAMPLES) - found)}"
    )
