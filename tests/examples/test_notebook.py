"""The example notebook runs, cell by cell, in a real Jupyter kernel (nbclient + ipykernel), on a
small slice of data: what a notebook user gets, including the live display inside a kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..cli.test_cli import needs_fashion

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook.ipynb"


@pytest.mark.e2e
@needs_fashion
@pytest.mark.timeout(300)
def test_the_example_notebook_runs_in_a_kernel(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("SPARKDP_EXAMPLE_ROWS", "2000")  # the kernel inherits this process's environment
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # a failing cell raises CellExecutionError with the cell's traceback
    nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    printed = [
        "".join(out.get("text", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream"
    ]
    text = "\n".join(printed)
    assert "second fit on the same session:" in text, text[-2000:]
    assert text.strip().splitlines()[-1].startswith("notebook: test accuracy "), text[-2000:]
    errors = [
        out for cell in notebook.cells for out in cell.get("outputs", []) if out.get("output_type") == "error"
    ]
    assert not errors, errors


SETUP = """
import torch, sparkdp
from torch import nn
spark = sparkdp.session("local[2]")
g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 32, generator=g)
y = (x.sum(1) > 0).long()
def fit(epochs):
    return sparkdp.fit(nn.Linear(32, 2), (x, y), workers=2, epochs=epochs, batch_size=16, spark=spark,
                       show_progress=False)
fit(1)
print("ready")
"""


@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.slow  # (make test-all) tests/spark/test_connect.py interrupts a job on both session kinds in make test
def test_interrupting_the_kernel_cancels_the_jobs_tasks_and_the_session_goes_on(tmp_path):
    """What "interrupt kernel" does in Jupyter: SIGINT to the kernel while a fit runs. The cell
    ends with KeyboardInterrupt, Spark has no job left running, and the next fit on the same
    session trains."""
    jupyter_client = pytest.importorskip("jupyter_client")
    import time

    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=60)

        def run(code: str, timeout: float) -> tuple[dict, str]:
            printed: list[str] = []

            def collect(msg: dict) -> None:
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])

            reply = client.execute_interactive(code, timeout=timeout, output_hook=collect)
            return reply["content"], "".join(printed)

        content, printed = run(SETUP, 150)
        assert content["status"] == "ok" and "ready" in printed, (content, printed)
        long_fit = client.execute("fit(10_000)")  # hours of epochs: only the interrupt ends it
        time.sleep(5)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=60)
        assert reply["parent_header"]["msg_id"] == long_fit
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", (
            reply
        )
        content, printed = run(
            "import time\n"
            "for _ in range(100):\n"
            "    if not spark.sparkContext.statusTracker().getActiveJobsIds(): break\n"
            "    time.sleep(0.2)\n"
            "print('active jobs', spark.sparkContext.statusTracker().getActiveJobsIds())\n"
            "print('trained', fit(2).history[-1]['samples'] > 0)",
            120,
        )
        assert content["status"] == "ok", content
        assert "active jobs []" in printed and "trained True" in printed, printed
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
