"""Exits with status 3 on rank 1 (to check the driver names the rank)."""

import sys

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("rank 1 is giving up")
    sys.exit(3)
