"""Train a small CNN on Fashion-MNIST tensors with ``sparkdp.fit``, then save it.

Shows the simplest entry point: ``fit`` takes ``(features, labels)`` tensors, runs the
training loop itself on 2 Spark workers (gradient all-reduce), evaluates on ``eval_data``
after every epoch and returns a ``TrainResult``, whose weights load back into plain PyTorch.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/fit_arrays.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/fit_arrays.py   # a quick smoke run
"""

import os
import sys
import tempfile

import safetensors.torch
import torch
from torch import nn

import sparkdp
from sparkdp.data.datasets import fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def main() -> None:
    data = fashion_mnist(limit=ROWS)  # float32 images in [0, 1], shape (N, 1, 28, 28)
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)

    torch.manual_seed(0)
    model = make_model()
    # batch_size is per worker: 2 workers x 32 = a global batch of 64 per step.
    result = sparkdp.fit(
        model,
        (x_train, y_train),
        eval_data=(x_test, y_test),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        strategy="allreduce",
        workers=2,
        epochs=1,
        batch_size=32,
        show_progress=False,
    )
    for epoch, row in enumerate(result.history, 1):
        print(f"epoch {epoch}: loss {row['loss']:.3f}, test accuracy {row['test_accuracy']:.3f}")

    with tempfile.TemporaryDirectory() as tmp:
        path = result.save(os.path.join(tmp, "model.safetensors"))
        # The file is a plain state dict: no sparkdp needed to use the model afterwards.
        reloaded = make_model()
        reloaded.load_state_dict(safetensors.torch.load_file(path))
        with torch.no_grad():
            accuracy = (reloaded(x_test).argmax(1) == y_test).float().mean().item()

    print(f"fit_arrays: test accuracy {accuracy:.3f} after {result.wall_s:.1f} s")
    if accuracy < 0.4:  # chance is 0.1 on ten classes; one 2,000-row epoch reaches about 0.6
        sys.exit(f"fit_arrays: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
