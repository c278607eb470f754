"""A Hogwild!-style single-machine script: ``--num-processes`` processes train one model that
lives in shared memory, without locks (``torch.multiprocessing``), then the main process tests
it. The shape of the classic PyTorch Hogwild example: ``model.share_memory()``, one
``train(rank, args, model)`` per process, each with its own optimizer and loader.

On Spark (``sparkdp launch --strategy hogwild ... -- --num-processes 1``) each Spark worker is
one of those processes and the parameter server is the shared model; the one sparkdp line in
``train`` is marked. Alone, ``distribute`` returns its arguments and the processes share memory
as before.
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
    torch.manual_seed(args.seed + rank)
    loader = torch.utils.data.DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)  # the one line
    for epoch in range(1, args.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(F.log_softmax(model(data), dim=1), target)
            loss.backward()
            optimizer.step()
            if batch_idx % 25 == 0:
                print(
                    f"{rank}\tTrain Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\t"
                    f"Loss: {loss.item():.6f}"
                )
    return model


def main():
    parser = argparse.ArgumentParser(description="Hogwild! example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = Net()
    if args.num_processes == 1:
        model = train(0, args, model)  # the trained model (on Spark: this worker's copy of the centre)
    else:
        model.share_memory()  # gradients are allocated lazily, so they are not shared
        processes = [mp.Process(target=train, args=(rank, args, model)) for rank in range(args.num_processes)]
        for p in processes:
            p.start()
        for p in processes:
            p.join()
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
