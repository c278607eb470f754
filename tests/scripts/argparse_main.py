"""A single-machine training script in the shape of the classic PyTorch examples: argparse in
``main()``, a ``Net``, a ``DataLoader``, Adadelta with a StepLR scheduler, progress lines that
read ``len(train_loader.dataset)``. The one sparkdp line is marked."""

import argparse
import json

import torch
import torch.nn.functional as F
from common_data import make_dataset
from torch import nn
from torch.optim.lr_scheduler import StepLR

import sparkdp


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser(description="example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(1)
    train_loader = torch.utils.data.DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    test_x, test_y = make_dataset(rows=1000, seed=1).tensors
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    model, optimizer, train_loader = sparkdp.distribute(model, optimizer, train_loader)  # the one line
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % 20 == 0:
                print(
                    f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}"
                )
        scheduler.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    if sparkdp.is_main_process():
        with open(args.out, "w") as fh:
            json.dump({"accuracy": accuracy, "keys": sorted(sparkdp.unwrap(model).state_dict())}, fh)


if __name__ == "__main__":
    main()
