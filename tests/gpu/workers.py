"""Worker functions for the GPU tests (module level, so that spawned processes can import them).

Each takes its device as a string and hands back CPU tensors and plain values: results travel
to the pytest process through ``torch.save``/``torch.load(weights_only=True)`` or a process
pool's pipe, and the pytest process need not hold CUDA memory for them.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.models import build_model
from sparkdp.state import state_from_bytes
from sparkdp.strategies import STRATEGIES, AllReduce, ParameterAveraging
from sparkdp.train.jobs import in_task
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss
from tests.helpers.dist import free_port
from tests.strategies.workers import make_problem, train_slices

LR, MOMENTUM = 0.1, 0.9


def _cpu(tensors) -> list[torch.Tensor]:
    return [t.detach().cpu().clone() for t in tensors]


def _device_of(model: nn.Module) -> str:
    return str(next(model.parameters()).device)


# --- collectives at world size 1 --------------------------------------------------------------


def collectives_on_device(coll) -> dict[str, Any]:
    """Every collective the strategies use, once, on tensors on ``coll.device``.

    At world size 1 a sum, a max or a mean over the ranks is the tensor itself and a broadcast
    keeps it: the test knows the values without running anything."""
    dev = coll.device
    summed = torch.tensor([1.0, -2.0, 3.5], device=dev)
    coll.all_reduce(summed, "sum")
    largest = torch.tensor([4.0, 0.5], device=dev)
    coll.all_reduce(largest, "max")
    # two dtypes: the coalesced path builds one flat buffer per dtype
    many = [torch.full((2, 2), 3.0, device=dev), torch.arange(3, dtype=torch.float64, device=dev)]
    coll.all_reduce_coalesced(many, "mean")
    sent = torch.tensor([7.0, 8.0], device=dev)
    coll.broadcast(sent, src=0)
    # the training loop's bookkeeping (loss sums, row counts) stays on the CPU in a CUDA job:
    # TorchCollective's group must take CPU tensors too (gloo beside NCCL)
    stats = torch.tensor([2.5, 4.0], dtype=torch.float64)
    coll.all_reduce(stats, "sum")
    on_device = (summed, largest, *many, sent)
    return {
        "backend": coll.backend,
        "group_backend": str(dist.get_backend()),
        "devices": [str(t.device) for t in on_device],
        "stats_device": str(stats.device),
        "values": _cpu(on_device),
        "stats": stats,
    }


# --- synchronous strategies: two ranks on one GPU ---------------------------------------------


def _momentum_sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def _strategy(name: str):
    # shared memory asked for, with every bucket eligible: the strategy must decline it for
    # CUDA tensors (a mapping of host memory cannot reduce them) and use the process group
    if name == "allreduce":
        return AllReduce(shared_memory=True, shared_memory_min_bytes=0)
    with warnings.catch_warnings():  # period=1's advice to use allreduce instead
        warnings.simplefilter("ignore", UserWarning)
        return ParameterAveraging(
            period=1, average_optimizer_state=True, shared_memory=True, shared_memory_min_bytes=0
        )


def train_sharded(
    coll, strategy_name: str, steps: int, batch: int, options: dict | None = None
) -> dict[str, Any]:
    """Each rank trains on ``coll.device`` on its slice of every global batch (momentum SGD);
    ``options``: the strategy made by name with them instead of the fixed ones above."""
    model, x, y = make_problem()
    if coll.rank != 0:  # a different start: the strategy must broadcast rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    model.to(coll.device)
    x, y = x.to(coll.device), y.to(coll.device)
    opt = _momentum_sgd(model)
    strategy = _strategy(strategy_name) if options is None else STRATEGIES.create(strategy_name, **options)
    train_slices(coll, model, opt, strategy, x, y, steps, batch)
    state = strategy.state_dict()
    outer = [
        v
        for entry in (state.get("outer") or {}).get("state", {}).values()
        for v in entry.values()
        if torch.is_tensor(v)
    ]  # diloco's outer momentum: checkpoints need it on the host
    return {
        "params": _cpu(model.parameters()),
        "options": strategy.options(),
        "device": _device_of(model),
        "state_devices": sorted({str(t.device) for t in outer}),
    }


def single_process(device: str, steps: int, batch: int, world: int) -> list[torch.Tensor]:
    """The reference: one process on ``device`` trains on the concatenated global batches."""
    model, x, y = make_problem()
    model.to(device)
    x, y = x.to(device), y.to(device)
    opt = _momentum_sgd(model)
    for step in range(steps):
        lo = step * batch * world
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[lo : lo + batch * world]), y[lo : lo + batch * world]).backward()
        opt.step()
    return _cpu(model.parameters())


# --- one Spark task's body, without Spark ------------------------------------------------------

CNN_ROWS, CNN_SIDE, CNN_CLASSES = 256, 12, 4


def _cnn_data() -> TensorData:
    """Noise images with one brighter quadrant, the class: learnable in a few epochs."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(CNN_ROWS, 1, CNN_SIDE, CNN_SIDE, generator=g)
    y = torch.randint(0, CNN_CLASSES, (CNN_ROWS,), generator=g)
    half = CNN_SIDE // 2
    for row, label in enumerate(y.tolist()):
        top, left = divmod(label, 2)
        x[row, 0, top * half : (top + 1) * half, left * half : (left + 1) * half] += 0.5
    return TensorData(x, y)


def _cnn_spec(epochs: int) -> FitSpec:
    torch.manual_seed(0)  # the same initial weights for every device
    model = build_model("cnn-small", image_size=CNN_SIDE, num_classes=CNN_CLASSES)
    data = _cnn_data()
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.05, momentum=0.9),
        strategy=AllReduce(),
        train=data,
        eval=data,
        training=TrainingConfig(epochs=epochs, batch_size=32, memory_format="contiguous"),
    )


def fit_cnn_as_a_task(gpus: tuple[str, ...], epochs: int) -> dict[str, Any]:
    """What a Spark barrier task runs for one worker (``train.jobs.in_task``: the device from
    the task's GPU addresses, a TorchCollective, ``fit_worker``), with a stand-in for the
    task's information instead of Spark's."""
    # cuDNN convolutions default to TF32 (10-bit mantissa); the CPU reference computes in float32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    info = SimpleNamespace(
        cpus=1, gpus=gpus, master_addr="127.0.0.1", master_port=free_port(), rank=0, world_size=1, store=None
    )
    spec = _cnn_spec(epochs)

    def body(coll):
        report = fit_worker(spec, coll)
        return {
            "history": report.history,
            "state": state_from_bytes(report.state),
            "device": str(coll.device),
            "backend": coll.backend,
            "trained_on": _device_of(spec.model),
        }

    return in_task(body, threads=1, pg_timeout_s=60)(info)


def local_rank_and_device(gpus: tuple[str, ...], local_rank: int) -> dict[str, Any]:
    """What a task with ``gpus`` and the given LOCAL_RANK (its place on its host) sees: its
    LOCAL_RANK, the current CUDA device, and the warnings ``in_task`` logged."""
    import logging
    import os

    from sparkdp.comm.torchrun_env import Placement

    warned: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("sparkdp.train.jobs").addHandler(handler)
    info = SimpleNamespace(
        cpus=1,
        gpus=gpus,
        master_addr="127.0.0.1",
        master_port=free_port(),
        rank=0,
        world_size=1,
        store=None,
        placement=Placement(0, 1, local_rank, local_rank + 1, 0, 1),
    )
    return in_task(
        lambda coll: {
            "LOCAL_RANK": os.environ["LOCAL_RANK"],
            "current": torch.cuda.current_device(),
            "warned": warned,
        },
        threads=1,
        pg_timeout_s=60,
    )(info)
