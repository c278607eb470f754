"""``distribute``: the one-line change inside a user's own training function (``sparkdp.run``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..data.base import WorkerData
from ..data.tensors import TensorData, as_worker_data
from .context import WorkerContext, current


class EpochSampler(DistributedSampler):
    """A seeded ``DistributedSampler`` that moves to the next epoch by itself after every pass,
    so a loop that never calls ``set_epoch`` still gets a new shuffle each epoch (one that does
    call it keeps control)."""

    def __iter__(self):
        indices = super().__iter__()  # drawn now, for the current epoch
        self.set_epoch(self.epoch + 1)
        return indices


def sharded_loader(loader: DataLoader, rank: int, world_size: int, seed: int) -> DataLoader:
    """A real ``DataLoader`` over this rank's shard of ``loader.dataset``, with the user's loader's
    settings (batch size, collate function, ``drop_last``, worker processes, pinning...)."""
    shuffle = not isinstance(loader.sampler, torch.utils.data.SequentialSampler)
    sampler = EpochSampler(
        loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
    )
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:  # DataLoader accepts these only with worker processes
        extra = {"persistent_workers": loader.persistent_workers, "prefetch_factor": loader.prefetch_factor}
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        collate_fn=loader.collate_fn,
        drop_last=loader.drop_last,
        num_workers=loader.num_workers,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        **extra,
    )


def distribute(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    data: Any = None,
    *,
    batch_size: int = 64,
    shuffle: bool = True,
):
    """Make a single-machine model, optimizer and data loader distributed — the one-line change.

    ``model, optimizer, loader = sparkdp.distribute(model, optimizer, loader)``: the
    model is wrapped as the job's strategy requires (DDP for ``allreduce``; the user's module
    is ``model.module``, or :func:`unwrap`), all ranks start from rank 0's weights (for an
    asynchronous strategy: from the parameter server's centre, which is the first worker's model), the
    optimizer object is returned unchanged (its ``step()`` now also does the strategy's
    communication), and a ``DataLoader`` comes back as a real ``DataLoader`` over this rank's
    shard (``loader.dataset``, ``len(loader)``, ``loader.batch_size`` as usual), reshuffled
    every pass. Outside a sparkdp job it returns its arguments as a world-size-1 job would,
    so the script still runs alone.

    Returns the model alone when only a model is given, else a tuple of what was given.
    """
    ctx = current()
    returned_opt = optimizer
    if optimizer is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # a stand-in so the strategy can bind
    strategy = ctx.new_strategy()
    wrapped = strategy.setup(model, optimizer, ctx.collective)
    out: list[Any] = [wrapped]
    if returned_opt is not None:
        out.append(returned_opt)
    if data is not None:
        loader = _shard_loader(data, ctx, batch_size, shuffle)
        if ctx.role.pushes_count_rows:  # (the server's figures)
            strategy.add_samples(loader.batch_size or 1)
        if ctx.probe is not None and ctx.probe.active:  # live monitoring counts the user's loop's steps
            ctx.probe.count_steps(optimizer, loader.batch_size or 1, strategy.comm_stats)
        out.append(loader)
    return out[0] if len(out) == 1 else tuple(out)


class WorkerDataLoader:
    """This rank's batches of a WorkerData (e.g. ParquetData), a new seeded epoch on every pass."""

    def __init__(
        self, data: WorkerData, rank: int, world_size: int, seed: int, batch_size: int, shuffle: bool
    ) -> None:
        self.data, self.rank, self.world_size, self.seed = data, rank, world_size, seed
        self.batch_size, self.shuffle, self.epoch = batch_size, shuffle, 0

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return self.data.batches(
            rank=self.rank,
            world_size=self.world_size,
            epoch=epoch,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
        )


def _shard_loader(
    data: Any, ctx: WorkerContext, batch_size: int, shuffle: bool
) -> DataLoader | WorkerDataLoader:
    if isinstance(data, DataLoader):
        loader = data
    elif isinstance(data, Dataset):
        loader = DataLoader(data, batch_size=batch_size, shuffle=shuffle)
    elif isinstance(data, WorkerData) and not isinstance(data, TensorData):
        return WorkerDataLoader(data, ctx.rank, ctx.world_size, ctx.seed, batch_size, shuffle)
    else:
        tensors = as_worker_data(data)
        assert isinstance(tensors, TensorData)
        loader = DataLoader(
            torch.utils.data.TensorDataset(tensors.features, tensors.labels),
            batch_size=batch_size,
            shuffle=shuffle,
        )
    return sharded_loader(loader, ctx.rank, ctx.world_size, ctx.seed)


def is_main_process() -> bool:
    """Whether this is rank 0 (always true outside a sparkdp job): save files, print summaries there.

    Examples:
        >>> import sparkdp
        >>> sparkdp.is_main_process()   # outside a job: one process, rank 0
        True

        In a worker: ``if sparkdp.is_main_process(): torch.save(sparkdp.unwrap(model).state_dict(), path)``.
    """
    return current().role.is_main_process


def unwrap(model: nn.Module) -> nn.Module:
    """The user's own module inside what :func:`distribute` returned (DDP's ``.module``), whose
    ``state_dict()`` has the single-machine keys (no ``module.`` prefix)."""
    while isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model


__all__ = ["EpochSampler", "distribute", "is_main_process", "sharded_loader", "unwrap"]
