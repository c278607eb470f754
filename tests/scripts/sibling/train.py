"""A script whose model and data come from a module next to it; writes its accuracy."""

import json
import sys

import torch
import torch.nn.functional as F
from netlib import build, data

import sparkdp

model = build()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
loader = torch.utils.data.DataLoader(data(), batch_size=32, shuffle=True)
model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)
for _ in range(int(sys.argv[1])):
    for x, y in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
x, y = data(1000, 1).tensors
with torch.no_grad():
    accuracy = (model(x).argmax(1) == y).float().mean().item()
if sparkdp.is_main_process():
    with open(sys.argv[2], "w") as fh:
        json.dump({"accuracy": accuracy}, fh)
