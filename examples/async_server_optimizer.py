"""Asynchronous training through a parameter server, with a server optimizer of its own.

Shows ``strategy="asgd"`` (Downpour / asynchronous SGD): the 2 workers train at their own
pace with their own optimizer (plain SGD here) and talk to a parameter server on the driver.
The server applies what they push with a *different* optimizer (Adam, via
``rule_options={"server_optimizer": "adam", "lr": ...}``). Interaction is multi-granular:
a worker pushes its accumulated update every 4 local batches and pulls the server's
weights every 2, trading freshness for traffic.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/async_server_optimizer.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/async_server_optimizer.py   # a quick smoke run
"""

import os
import sys

import torch
from torch import nn

import sparkdp
from sparkdp.data.datasets import fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def main() -> None:
    data = fashion_mnist(limit=ROWS)
    train = (torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
    test = (torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    result = sparkdp.fit(
        model,
        train,
        eval_data=test,
        optimizer="sgd",
        optimizer_options={"lr": 0.05, "momentum": 0.0},  # the workers' optimizer
        strategy="asgd",
        strategy_options={
            # The server's optimizer and its learning rate: Adam's steps are about lr per
            # weight whatever the gradient's scale, so it wants a much smaller lr than SGD.
            "rule_options": {"server_optimizer": "adam", "lr": 0.002},
            "push_every": 4,  # local batches between pushes: each push moves the whole model
            "pull_every": 2,  # local batches between pulls of the server's weights
        },
        workers=2,
        epochs=1,
        batch_size=32,
        show_progress=False,
    )

    accuracy = result.test_accuracy
    server = result.details["server"]  # the parameter server's own counters
    print(
        f"server: {server['pushes_applied']} pushes applied, {server['pulls']} pulls, "
        f"staleness histogram {server['staleness']}"
    )
    print(f"async_server_optimizer: test accuracy {accuracy:.3f}")
    if accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"async_server_optimizer: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
