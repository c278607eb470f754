"""A plain single-machine PyTorch training script, plus the one ``sparkdp.distribute`` line.

Run it alone, on one process:
    python examples/scripts/train_mnist.py --epochs 1
or on 2 Spark workers, unchanged (see examples/launch_script.py):
    sparkdp launch --workers 2 examples/scripts/train_mnist.py -- --epochs 1
Under ``sparkdp launch`` every worker runs this file as ``__main__`` with these arguments.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import sparkdp
from sparkdp.data.datasets import fashion_mnist


def main() -> None:
    parser = argparse.ArgumentParser(description="Fashion-MNIST MLP")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=20000, help="training rows to use")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out", help="write the final test accuracy here as JSON")
    args = parser.parse_args()

    data = fashion_mnist(limit=args.rows)
    loader = DataLoader(
        TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        batch_size=args.batch_size,
        shuffle=True,
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)  # the one line

    for epoch in range(1, args.epochs + 1):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: last batch loss {loss.item():.3f} ({len(loader)} batches here)")

    model.eval()
    with torch.no_grad():
        x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    if sparkdp.is_main_process():  # true when run alone too
        print(f"test accuracy {accuracy:.3f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"accuracy": accuracy, "keys": sorted(sparkdp.unwrap(model).state_dict())}, f)


if __name__ == "__main__":
    main()
