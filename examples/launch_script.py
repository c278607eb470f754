"""Run an existing training script on Spark with ``sparkdp.launch``.

Shows the driver side of ``examples/scripts/train_mnist.py``, a plain argparse script whose
only change is the ``sparkdp.distribute`` line. ``launch`` runs the file as ``__main__`` on
every worker with the given arguments; each worker's printed lines reach this console
prefixed ``[rank R]``. The same job from a shell:

    sparkdp launch --workers 2 examples/scripts/train_mnist.py -- --epochs 1

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/launch_script.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/launch_script.py   # a quick smoke run
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import sparkdp

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))
SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_mnist.py"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "accuracy.json")
        # Arguments are strings, exactly as they would follow the script on a command line.
        # launch returns nothing: a script reports through its files (here --out, which
        # only rank 0 writes) or its output, and a failing rank raises sparkdp.WorkerFailed.
        sparkdp.launch(SCRIPT, "--epochs", "1", "--rows", str(ROWS), "--out", out, workers=2)
        with open(out) as f:
            accuracy = json.load(f)["accuracy"]
    print(f"launch_script: test accuracy {accuracy:.3f}")
    if accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"launch_script: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
