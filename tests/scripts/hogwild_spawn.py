"""The canonical single-machine Hogwild! script, which always starts its processes: the model
in shared memory (``model.share_memory()``), a start method set once, ``--num-processes``
``torch.multiprocessing.Process``es each running ``train(rank, args, model)`` with its own
seed, loader and optimizer; the main process joins them and tests the model.

The one sparkdp line sits where a user adds it, inside ``train`` after the optimizer is
built. Alone it returns its arguments; launched with an asynchronous strategy every process a
Spark worker starts joins the job's parameter server (two-level Hogwild!).
"""

import argparse
import json

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from common_data import make_dataset
from torch import nn

import sparkdp


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train(rank, args, model):
    torch.set_num_threads(1)
    torch.manual_seed(args.seed + rank)
    loader = torch.utils.data.DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)  # the one line
    for _epoch in range(args.epochs):
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()


def main():
    parser = argparse.ArgumentParser(description="Hogwild! with processes")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--start-method", choices=["spawn", "fork"], default="spawn")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    mp.set_start_method(args.start_method, force=True)
    torch.manual_seed(args.seed)
    model = Net()
    model.share_memory()
    processes = [mp.Process(target=train, args=(rank, args, model)) for rank in range(args.num_processes)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    if any(p.exitcode for p in processes):
        raise SystemExit(f"a training process failed: exit codes {[p.exitcode for p in processes]}")
    test_x, test_y = make_dataset(rows=1000, seed=1).tensors
    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(f"Test accuracy: {accuracy:.4f}")
    if sparkdp.is_main_process():
        with open(args.out, "w") as fh:
            json.dump({"accuracy": accuracy}, fh)


if __name__ == "__main__":
    main()
