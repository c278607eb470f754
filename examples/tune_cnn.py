"""Search a small CNN's learning rate and batch size on Fashion-MNIST with ``sparkdp.tune``.

Every trial is a ``sparkdp.fit`` job of its own (1 worker here) on the embedded local Spark;
two run at once, each on its share of the cores. Optuna's TPE sampler chooses each trial's
values from what ``space`` asks for, and its median pruner stops a trial whose test accuracy
after an epoch is below the median of the finished trials' at that epoch.

Run (20,000 training rows by default; a few minutes on 2 cores):
    python examples/tune_cnn.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/tune_cnn.py   # a quick smoke run
"""

import os
import sys

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
        nn.Flatten(),
        nn.Linear(16 * 14 * 14, 10),
    )


def space(trial) -> dict:
    """Optuna's define-by-run: ask the trial for values, return ``fit``'s keywords."""
    return {
        "optimizer_options": {"lr": trial.suggest_float("lr", 1e-3, 0.3, log=True), "momentum": 0.9},
        "batch_size": trial.suggest_categorical("batch_size", [32, 64]),
    }


def main() -> None:
    data = fashion_mnist(limit=ROWS)  # float32 images in [0, 1], shape (N, 1, 28, 28)
    train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    test = torch.from_numpy(data.x_test[:2000]), torch.from_numpy(data.y_test[:2000])

    torch.manual_seed(0)
    result = sparkdp.tune(
        space,
        model=make_model(),  # every trial starts from a copy of these weights
        data=train,
        eval_data=test,
        workers=1,
        epochs=2,
        trials=4,
        concurrent_trials=2,
        metric="test_accuracy",
        direction="maximize",
        pruner="median:n_startup_trials=2",
        seed=7,
    )
    best = result["best"]
    states = [t["state"] for t in result["trials"]]
    print(f"trials: {', '.join(f'{s} {states.count(s)}' for s in sorted(set(states)))}")
    print(f"tune_cnn: test accuracy {best['value']:.3f} with {best['params']}")
    if best["value"] < 0.4 or "failed" in states:  # chance is 0.1; one 2,000-row epoch reaches about 0.6
        sys.exit(f"tune_cnn: best accuracy {best['value']:.3f} or a failed trial: the search is broken")


if __name__ == "__main__":
    main()
