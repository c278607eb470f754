"""Your own training loop on Spark: ``sparkdp.run`` + the one ``sparkdp.distribute`` line.

Shows how to keep a plain PyTorch loop (model, optimizer, DataLoader, ``for x, y in loader``)
and run it on 2 Spark workers with gradient all-reduce. ``distribute`` wraps the model (DDP),
hooks the optimizer and shards the DataLoader; everything else is single-machine code, and
``train()`` still runs alone when called directly (world size 1). Rank 0 saves the weights
with ``sparkdp.unwrap``, so the file has the usual single-machine keys.

Run (20,000 training rows by default; under a minute on 2 cores):
    python examples/run_distribute.py
    SPARKDP_EXAMPLE_ROWS=2000 python examples/run_distribute.py   # a quick smoke run
"""

import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import sparkdp
from sparkdp.data.datasets import fashion_mnist

ROWS = int(os.environ.get("SPARKDP_EXAMPLE_ROWS", "20000"))


def train(rows: int, epochs: int, save_to: str) -> float:
    # Runs on every worker. Each one loads the data itself, which beats shipping it inside
    # the Spark task; on a cluster the files must exist on every executor.
    data = fashion_mnist(limit=rows)
    loader = DataLoader(
        TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        batch_size=32,
        shuffle=True,
    )
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 14 * 14, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)  # the one line

    for _ in range(epochs):
        model.train()
        for x, y in loader:  # this worker's shard, reshuffled every pass
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()  # gradients were averaged across workers during backward()

    net = sparkdp.unwrap(model).eval()  # the plain module: no DDP prefix, no collectives
    with torch.no_grad():
        x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
        accuracy = (net(x_test).argmax(1) == y_test).float().mean().item()
    if sparkdp.is_main_process():  # all ranks hold the same weights: write them once
        torch.save(net.state_dict(), save_to)
    return accuracy  # sparkdp.run returns rank 0's value


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.pt")
        # Local workers share this filesystem; on a cluster, save to storage every node reaches.
        accuracy = sparkdp.run(train, ROWS, 1, path, workers=2, strategy="allreduce", show_progress=False)
        keys = sorted(torch.load(path, weights_only=True))  # tensors only: nothing unpickled
    print(f"saved state dict keys: {keys}")
    print(f"run_distribute: test accuracy {accuracy:.3f}")
    if accuracy < 0.4:  # chance is 0.1 on ten classes
        sys.exit(f"run_distribute: accuracy {accuracy:.3f} is too low, training is broken")


if __name__ == "__main__":
    main()
