"""Every program in examples/ runs as a user runs it, as ``__main__``, here on a small slice of data:
all of them one after another in one subprocess, as from one Python session, so that Spark
starts once (the first example's ``sparkdp.session()`` starts it, the others reuse it).

Each example reads SPARKDP_EXAMPLE_ROWS, trains on 2 workers of the embedded local Spark,
checks its own result (exiting non-zero when it is clearly broken) and ends with one line
naming itself; these tests check the exit status and that line. A new example must be added
to EXAMPLES, which test_every_example_is_tested enforces.
"""

from __future__ import annotations

import json
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
# and 800 prompt/completion pairs are enough for the fine-tuned adapters to lower the held-out loss
ROWS_OF = {"language_model.py": "500", "fine_tune_table.py": "800"}

# example file -> the start of the last line it prints on success
EXAMPLES = {
    "async_server_optimizer.py": "async_server_optimizer: test accuracy ",
    "caffe_net.py": "caffe_net: test accuracy ",
    "dataframe_parquet.py": "dataframe_parquet: test accuracy ",
    "fine_tune_table.py": "fine_tune_table: held-out loss ",
    "fit_arrays.py": "fit_arrays: test accuracy ",
    "language_model.py": "language_model: loss ",
    "launch_script.py": "launch_script: test accuracy ",
    "ml_pipeline.py": "ml_pipeline: test accuracy ",
    "predict_dataframe.py": f"predict_dataframe: {ROWS} rows scored, accuracy ",
    "run_distribute.py": "run_distribute: test accuracy ",
    "tune_cnn.py": "tune_cnn: test accuracy ",
}

# examples run only by `make test-all`, each with the tests that cover the same path in `make test`
SLOW = {
    # the longest example (Spark jobs that tokenize, train LoRA 3 epochs, score twice and generate,
    # each task opening transformers and PEFT): tests/spark/test_fine_tune_e2e.py tokenizes and
    # packs a table, trains, exports and reopens LoRA adapters in PEFT; tests/spark/test_predict.py
    # scores with output="loss"; tests/models/test_generation.py ships a PEFT model to generate
    "fine_tune_table.py": pytest.mark.slow,
}


def _missing_for(name: str) -> str | None:
    """Why an example cannot run here, or None."""
    if name != "language_model.py":
        return None
    if not FORTUNES_DIR.is_dir():
        return "the Debian package `fortunes` is not installed"
    return None


@pytest.fixture(scope="module")
def example_runs(request, tmp_path_factory) -> tuple[dict[str, dict], subprocess.CompletedProcess]:
    """Every example this session selected, run in turn in one subprocess (tests/examples/run_examples.py)
    on the one Spark session the first of them starts: a JVM and a Python worker daemon
    started once instead of once per example. Each runs in an empty directory of its own."""
    wanted = [
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_example_runs_on_a_small_slice"
    ]
    runnable = [name for name in sorted(set(wanted)) if _missing_for(name) is None]
    jobs = []
    for name in runnable:
        cwd = tmp_path_factory.mktemp(name.removesuffix(".py"))
        jobs.append([name, ROWS_OF.get(name, ROWS), str(cwd)])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("run_examples.py")), json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=200 * max(1, len(jobs)),
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            run = json.loads(line.removeprefix("RESULT "))
            results[run["name"]] = run | {"cwd": next(job[2] for job in jobs if job[0] == run["name"])}
    return results, proc


@pytest.mark.e2e
@needs_fashion
@pytest.mark.timeout(1800)  # the first test's set-up runs every example (about 20 s each on 2 cores)
@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=SLOW[name]) if name in SLOW else name for name in sorted(EXAMPLES)]
)
def test_example_runs_on_a_small_slice(name, example_runs):
    if (missing := _missing_for(name)) is not None:
        pytest.skip(missing)
    results, proc = example_runs
    assert name in results, f"{name} did not finish\n{_explain(proc)}"
    run = results[name]
    explained = f"{name} exited with {run['returncode']}\nprinted:\n{run['stdout'][-3000:]}\n{_explain(proc)}"
    assert run["returncode"] == 0, explained
    lines = run["stdout"].strip().splitlines()
    assert lines and lines[-1].startswith(EXAMPLES[name]), explained
    assert not list(Path(run["cwd"]).iterdir()), f"{name} left files in its working directory"


def test_every_example_is_tested():
    found = {path.name for path in EXAMPLES_DIR.glob("*.py")}
    assert found == set(EXAMPLES), (
        f"examples without a test: {sorted(found - set(EXAMPLES))}; "
        f"tests without an example: {sorted(set(EXAMPLES) - found)}"
    )
