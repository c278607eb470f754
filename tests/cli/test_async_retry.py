"""An asynchronous worker that fails is restarted by the job's controller and the job still finishes."""

import json
import os
import subprocess
import sys

import pytest

FLAKY = '''
import os

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(256, 4)
y = (x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) > 0).long()
calls = 0


class Flaky(nn.Module):
    """Fails on its 5th forward in task 1, once per job (MARK records it), as a lost executor would."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, inputs):
        global calls
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 1 and not os.path.exists(MARK):
            calls += 1
            if calls == 5:
                open(MARK, "w").close()
                raise RuntimeError("simulated executor loss")
        return self.net(inputs)


model = Flaky()
train_data = (x, y)
test_data = (x, y)
batch_size = 16
'''


@pytest.mark.e2e
@pytest.mark.slow  # (make test-all) tests/spark/test_recovery.py retries a killed asynchronous worker in make test
def test_a_failed_async_task_is_restarted_and_its_replayed_pushes_are_not_double_applied(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(f"MARK = {str(tmp_path / 'failed-once')!r}\n" + FLAKY)
    summary = tmp_path / "s.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkdp.cli.main",
            "train",
            str(script),
            "--master",
            "local[2,2]",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--strategy",
            "asgd",
            "--lr",
            "0.1",
            "--momentum",
            "0",
            "--optimizer",
            "sgd",
            "--strategy-option",
            'rule_options={"lr": 0.1}',
            "--json-out",
            str(summary),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(summary.read_text())
    # the same keys as a synchronous run: workers is the count; per-worker figures have their own key
    assert data["workers"] == 2 and [w["worker"] for w in data["per_worker"]] == [0, 1]
    server = data["server"]
    # each worker pushes 8 batches x 2 epochs. The failed attempt of worker 1 ran forward 5 times
    # (the first-batch check + 4 steps) and pushed after 3 completed steps before failing; the
    # restart runs both workers' 16 again (no epoch was covered yet), continuing the sequence
    # numbers after the last applied push, plus what worker 0 pushed before the attempt ended
    assert server["pushes_applied"] >= 16 + 16 + 3, server
    assert server["rejected"] == 0 and server["duplicates_dropped"] == 0, server
    assert "-- restart 1 of 3 from the parameter server's current centre" in proc.stderr, proc.stderr[-4000:]
    assert "sparkdp: recovered from failure 1 (" in proc.stderr
    assert data["test_accuracy"] > 0.85
