"""Train a Caffe model (net + solver prototxt) on Spark with ``sparkdp.caffe.fit_caffe``.

Shows the Caffe entry point: ``examples/caffe/lenet_small.prototxt`` is a LeNet-style net and
``lenet_small_solver.prototxt`` its solver (SGD with momentum, weight decay, the "inv"
learning-rate policy, per-layer lr_mult). ``fit_caffe`` builds the net as a PyTorch module,
rebuilds the solver on every worker and trains with sparkdp's all-reduce. The same job from a
shell:

    sparkdp train --caffe-net examples/caffe/lenet_small.prototxt \\
        --caffe-solver examples/caffe/lenet_small_solver.prototxt \\
        --dataset fashion-mnist --limit 20000 --workers 2 --epochs 1

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/caffe_net.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/caffe_net.py   # a quick smoke run
"""

import os
import sys
import tempfile
from pathlib import Path

import torch

from sparkdp.caffe import fit_caffe, save_weights
from sparkdp.data.datasets import fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))
HERE = Path(__file__).resolve().parent / "caffe"


def main() -> None:
    data = fashion_mnist(limit=ROWS)
    train = (torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
    test = (torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))
    # The images are floats in [0, 1]; Caffe's Data layer saw bytes 0..255. raw_scale=255
    # restores that before the prototxt's own transform_param scale applies.
    # epochs=1 overrides the epochs the solver's max_iter would give; the batch size
    # (32 per worker) comes from the Data layer.
    result = fit_caffe(
        HERE / "lenet_small.prototxt",
        HERE / "lenet_small_solver.prototxt",
        train,
        eval_data=test,
        raw_scale=255.0,
        epochs=1,
        workers=2,
        show_progress=False,
    )
    accuracy = result.test_accuracy
    with tempfile.TemporaryDirectory() as tmp:
        # Back to Caffe's own format: a .caffemodel that Caffe (or fit_caffe(weights=...)) loads.
        path = save_weights(result.model, os.path.join(tmp, "lenet_small.caffemodel"))
        print(f"saved {path.name}: {path.stat().st_size:,} bytes")
    print(f"caffe_net: test accuracy {accuracy:.3f}")
    if accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"caffe_net: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
