"""A script written for ``torchrun``: it initialises the process group, wraps the model in DDP
and shards with DistributedSampler itself. Nothing sparkdp in it."""

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common_data import make_dataset
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        print(f"rank {rank} finished epoch {epoch + 1} of {args.epochs}")
    test_x, test_y = make_dataset(rows=1000, seed=1).tensors
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"accuracy": accuracy, "world": world}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
