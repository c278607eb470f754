"""ZeRO stage 1: ``allreduce`` with the optimizer state sharded over the workers.

Gradients are all-reduced as in ``allreduce`` (DDP), so every rank holds whole parameters and
whole averaged gradients; but each rank's optimizer steps only its own partition of the
parameters (PyTorch's ``ZeroRedundancyOptimizer`` partition: parameters by size, largest
first, to the least-loaded rank), so only that partition has optimizer state (AdamW's two
moments: 2/N of the parameters' bytes instead of 2). After the step each rank broadcasts its
partition's new values to the others. The arithmetic is ``allreduce``'s.

The user's optimizer object stays the one the loop steps (a scheduler built on it keeps
working): it is the ``ZeroRedundancyOptimizer``'s local optimizer. Its groups hold every
parameter, except during ``step()``, when a pre-hook narrows them to this rank's partition
(so zero_grad, clipping and loss unscaling still see every gradient); the post-hook widens
them again and broadcasts the partitions.
"""

from __future__ import annotations

import time
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from .. import state as state_io
from ..comm.base import Collective
from ..errors import ConfigError
from .allreduce import AllReduce

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle


class ZeRO1(AllReduce):
    """Gradient all-reduce every step, the optimizer state sharded over the workers.

    Takes ``allreduce``'s options (buckets, shared memory, compression). The full optimizer
    state for results and checkpoints is gathered on rank 0 keyed by parameter index, as
    ``allreduce`` saves it, so either strategy, on any number of workers, resumes from it.
    """

    name = "zero1"

    def __init__(self, **allreduce_options: Any) -> None:
        super().__init__(**allreduce_options)
        self._zero: Any = None  # the ZeroRedundancyOptimizer (after setup, on 2+ workers)
        self._sync_bytes = (0, 0)  # a step's broadcast bytes: (sent, received)
        self._whole: list[list[nn.Parameter]] = []  # each group's parameters
        self._partition: list[list[nn.Parameter]] = []  # each group's parameters this rank steps
        self._narrow: RemovableHandle | None = None  # the step pre-hook

    def adopt_precision(self, dtype: torch.dtype) -> None:
        if dtype == torch.float16:
            # a GradScaler would look for infinite gradients in this rank's partition only: ranks
            # would skip different steps and their loss scales drift apart
            raise ConfigError(
                "precision='fp16-mixed' does not combine with strategy='zero1' (each rank's optimizer "
                "sees only its own partition, so their loss scaling would disagree); use "
                "precision='bf16-mixed', which needs no scaling."
            )

    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        net = super().setup(model, optimizer, collective)
        if collective.world_size == 1:
            return net
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not dist.is_initialized():
            raise ConfigError(
                "strategy='zero1' needs a torch.distributed process group (the synchronous "
                "launcher's); it cannot run over this worker's collective."
            )
        whole = [list(group["params"]) for group in optimizer.param_groups]
        partition: list[list[nn.Parameter]] = []

        def local(groups: list[dict[str, Any]], **_defaults: Any) -> Optimizer:
            # ZeroRedundancyOptimizer's local optimizer is the user's own: this rank's partition
            # of each group is what its steps update (the step pre-hook narrows the groups to it)
            partition.extend(list(group["params"]) for group in groups)
            return optimizer

        # any callable that builds the local optimizer will do (torch calls it, never subclasses it)
        self._zero = ZeroRedundancyOptimizer(
            [dict(group) for group in optimizer.param_groups],
            optimizer_class=local,  # type: ignore[arg-type]
        )
        self._whole, self._partition = whole, partition
        self._drop_foreign_state(optimizer)
        self._narrow = optimizer.register_step_pre_hook(
            lambda _opt, _args, _kwargs: self._set_groups(partition)
        )
        mine = sum(_nbytes(p) for ps in partition for p in ps)
        total = sum(_nbytes(p) for ps in whole for p in ps)
        self._sync_bytes = (mine * (collective.world_size - 1), total - mine)
        return net

    def _set_groups(self, params: list[list[nn.Parameter]]) -> None:
        assert self.optimizer is not None
        for group, ps in zip(self.optimizer.param_groups, params, strict=True):
            group["params"] = ps

    def _drop_foreign_state(self, optimizer: Optimizer) -> None:
        """Forget the optimizer state of parameters other ranks step (a whole state loaded)."""
        kept = {id(p) for ps in self._partition for p in ps}
        for p in [p for p in optimizer.state if id(p) not in kept]:
            del optimizer.state[p]

    def after_step(self) -> None:
        super().after_step()
        if self._zero is None:
            return
        # outside the step the groups hold every parameter: zero_grad, gradient clipping and
        # loss unscaling see all the gradients, as under allreduce
        self._set_groups(self._whole)
        started = time.perf_counter()
        # ZeroRedundancyOptimizer.step() would run its local optimizer, which is the user's and
        # has just stepped; what is left of it is the broadcast of every rank's partition
        self._zero._sync_params()
        self.comm.add(time.perf_counter() - started, *self._sync_bytes)

    def finish(self) -> None:
        if self._narrow is not None:
            self._narrow.remove()
            self._narrow = None
        super().finish()

    # -- whole states -----------------------------------------------------------------------------

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The whole optimizer state on rank 0, as ``optimizer.state_dict()`` of an unsharded run
        numbers it (every rank calls it; the others get an empty dict). Each rank's partition
        travels as ``sparkdp.state`` bytes (tensors and JSON, never a pickle)."""
        if self._zero is None:
            return super().optimizer_state(optimizer)
        index = {id(p): i for i, p in enumerate(chain.from_iterable(self._whole))}
        mine = {str(index[id(p)]): dict(values) for p, values in optimizer.state.items()}
        parts = _gather_bytes(state_io.to_bytes(mine))
        if parts is None:
            return {}
        moments = {int(k): v for part in parts for k, v in state_io.from_bytes(part).items()}
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": [index[id(p)] for p in whole]}
            for group, whole in zip(optimizer.param_groups, self._whole)
        ]
        return {"state": dict(sorted(moments.items())), "param_groups": groups}

    def load_optimizer_state(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a whole optimizer state (any strategy's that numbers parameters by index, written
        by any number of workers): this rank keeps its partition's part of it."""
        if state.get("param_groups") and isinstance(state["param_groups"][0]["params"][0], str):
            raise ConfigError(
                "this optimizer state was saved by a sharding strategy (keyed by parameter name); "
                "strategy='zero1' resumes from states keyed by parameter index (allreduce's or zero1's)."
            )
        super().load_optimizer_state(optimizer, state)
        if self._zero is not None:
            self._drop_foreign_state(optimizer)

    def options(self) -> dict[str, Any]:
        return {
            **super().options(),
            "optimizer_shards": self._zero.world_size if self._zero is not None else 1,
        }

    def __getstate__(self) -> dict[str, Any]:
        # shipped to the workers before setup
        return {
            **self.__dict__,
            "_zero": None,
            "_whole": [],
            "_partition": [],
            "_narrow": None,
            "model": None,
            "optimizer": None,
            "collective": None,
            "_hook": None,
        }


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _gather_bytes(blob: bytes, dst: int = 0) -> list[bytes] | None:
    """Every rank's ``blob`` on rank ``dst``, by rank (None elsewhere): lengths first, then the
    bytes padded to the longest."""
    world = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(blob)], dtype=torch.int64))
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    mine = dist.get_rank() == dst
    received = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)] if mine else None
    dist.gather(padded, received, dst=dst)
    if received is None:
        return None
    return [bytes(t[: int(n)].numpy()) for t, n in zip(received, sizes)]
