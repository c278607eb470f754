"""Fully sharded data parallelism (ZeRO-3) with PyTorch's FSDP2 (``fully_shard``).

Each rank keeps 1/N of every parameter, of its gradient and of the optimizer's state. A
wrapped block all-gathers its parameters just before its forward (and again before its
backward when ``reshard_after_forward``), and its gradients are reduce-scattered, so every
rank steps its own shard with the averaged gradient: the same arithmetic as ``allreduce``
with a fraction of the model state per worker (docs/guide/strategies.md, "fsdp").

The optimizer must hold the sharded parameters, so the training loop calls :meth:`FSDP.shard`
before it builds the optimizer; :func:`sparkdp.distribute` hands over an optimizer built on the
whole parameters, which :meth:`FSDP.setup` points at the shards instead.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from .. import state as state_io
from ..comm.base import Collective
from ..config import check_int
from ..errors import ConfigError
from ..frozen import frozen_names, trainable_state
from ..models.gpt import GPTBlock
from .base import Strategy, ring_bytes

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: ``param_dtype`` names the strategy accepts, and their torch dtypes
PARAM_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}
#: block classes sharded one by one wherever they occur (Hugging Face models name theirs in
#: ``_no_split_modules``)
BLOCK_CLASSES: tuple[type[nn.Module], ...] = (GPTBlock,)


class FSDP(Strategy):
    """Parameters, gradients and optimizer state sharded over the workers (FSDP2).

    Args:
        reshard_after_forward: free each block's gathered parameters after its forward and
            gather them again for backward (least memory); False keeps them until backward
            (one all-gather fewer per block and step, a whole unsharded model at the peak).
        min_params: in a model without known transformer blocks, each submodule holding at
            least this many parameters (not already in a sharded submodule) becomes its own
            shard unit; the rest go with the root.
        param_dtype: compute and all-gather the parameters in this dtype (``"bf16"``,
            ``"fp16"``; None: as stored, float32), keeping float32 shards for the optimizer.
        reduce_dtype: the dtype gradients are reduce-scattered in (default float32).
        sharded_checkpoints: every rank writes its own shards to the job's checkpoints
            (``train.sharded_checkpoint``; resumable on any number of workers); False gathers
            the whole model and optimizer state to rank 0 for each checkpoint, as other
            strategies save.
    """

    name = "fsdp"
    channels_last_weights = False  # the shards are flat slices of each weight's dim 0

    def __init__(
        self,
        reshard_after_forward: bool = True,
        min_params: int = 1_000_000,
        param_dtype: str | None = None,
        reduce_dtype: str = "fp32",
        sharded_checkpoints: bool = True,
    ) -> None:
        super().__init__()
        check_int("fsdp: min_params", min_params)
        self.reshard_after_forward = _flag("reshard_after_forward", reshard_after_forward)
        self.min_params = int(min_params)
        self.param_dtype = None if param_dtype is None else _dtype_name("param_dtype", param_dtype)
        self.reduce_dtype = _dtype_name("reduce_dtype", reduce_dtype)
        self.sharded_checkpoints = _flag("sharded_checkpoints", sharded_checkpoints)
        self._sharded: nn.Module | None = None
        self._skeleton: nn.Module | None = None  # the model's structure on the meta device, for evaluation
        self._replica: nn.Module | None = None
        self._units: list[str] = []
        self._step_bytes = 0
        self._job_dtype: str | None = None  # the job's mixed precision (adopt_precision), beside the option

    def mixed_precision(self, dtype: torch.dtype | str | None) -> None:
        """Compute in ``dtype`` (parameters all-gathered and used in it; None: float32), with
        float32 shards for the optimizer and ``reduce_dtype`` for the gradient reductions."""
        if isinstance(dtype, torch.dtype):
            dtype = next((k for k, v in PARAM_DTYPES.items() if v == dtype), str(dtype))
        self.param_dtype = None if dtype is None else _dtype_name("param_dtype", dtype)

    def adopt_precision(self, dtype: torch.dtype) -> None:
        """The job's mixed precision becomes the all-gathered parameters' dtype, unless the
        ``param_dtype`` option chose one (the option itself stays as the user set it)."""
        if dtype == torch.float16:
            # a plain GradScaler decides to skip a step from its own rank's gradient shards only:
            # ranks would disagree and their loss scales drift apart
            raise ConfigError(
                f"precision='fp16-mixed' does not combine with strategy={self.name!r} (each rank holds "
                "only its own gradient shards, so their loss scaling would disagree); use "
                "precision='bf16-mixed', which needs no scaling."
            )
        self._job_dtype = next((k for k, v in PARAM_DTYPES.items() if v == dtype), None)

    @property
    def gathered_dtype(self) -> str | None:
        """The dtype parameters are all-gathered and computed in (None: float32): the
        ``param_dtype`` option, else the job's mixed precision."""
        return self.param_dtype or self._job_dtype

    # -- sharding -------------------------------------------------------------------------------

    def shard(self, model: nn.Module, collective: Collective) -> nn.Module:
        """Start every rank from rank 0's weights, then shard ``model`` in place: its blocks one
        by one, then the root. Build the optimizer on the returned module's parameters."""
        if self._sharded is not None:
            return self._sharded
        self._skeleton = _meta_copy(model)
        if collective.world_size > 1:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            if not dist.is_initialized():
                raise ConfigError(
                    f"strategy={self.name!r} needs a torch.distributed process group (the synchronous "
                    "launcher's); it cannot run over this worker's collective."
                )
            collective.broadcast_coalesced([t.data for t in [*model.parameters(), *model.buffers()]], src=0)
            mesh = self.device_mesh(collective)
            policy = MixedPrecisionPolicy(
                param_dtype=PARAM_DTYPES[self.gathered_dtype] if self.gathered_dtype else None,
                reduce_dtype=PARAM_DTYPES[self.reduce_dtype],
            )
            self._units = adapter_units(model) + shard_units(model, self.min_params)
            for name in self._units:
                fully_shard(
                    model.get_submodule(name),
                    mesh=mesh,
                    mp_policy=policy,
                    reshard_after_forward=self.reshard_after_forward,
                )
            fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=self.reshard_after_forward)
        passes = 2 if self.reshard_after_forward else 1
        gathered_dtype = PARAM_DTYPES[self.gathered_dtype] if self.gathered_dtype else None
        frozen = sum(
            p.numel() * (gathered_dtype or p.dtype).itemsize * passes
            for p in model.parameters()
            if not p.requires_grad
        )
        values = sum(p.numel() for p in model.parameters() if p.requires_grad)
        gathered = (gathered_dtype or torch.float32).itemsize * passes
        self._step_bytes = self.wire_bytes(values, gathered, collective.world_size, frozen)
        self._sharded = model
        return model

    def device_mesh(self, collective: Collective) -> DeviceMesh:
        """The mesh the model is sharded over: every worker in one dimension."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(collective.device.type, (collective.world_size,))

    def wire_bytes(self, values: int, gathered: int, world_size: int, frozen: int = 0) -> int:
        """Bytes each rank sends (and receives) per step for ``values`` trainable values, gathered
        at ``gathered`` bytes each over a step: the all-gathers (forward, and backward when
        resharding) and one reduce-scatter, each half a ring; ``frozen``: the bytes a frozen base
        adds to the all-gathers over a step (it has no gradient to reduce)."""
        reduced = values * (gathered + PARAM_DTYPES[self.reduce_dtype].itemsize)
        return ring_bytes(reduced + frozen, world_size) // 2

    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        if self._sharded is None:  # sparkdp.distribute: the optimizer holds the whole parameters
            whole = list(model.parameters())
            if optimizer.state:
                raise ConfigError(
                    "strategy='fsdp' shards the optimizer's state, so the optimizer must not have "
                    "stepped yet: call sparkdp.distribute(model, optimizer, ...) before training."
                )
            self.shard(model, collective)
            _point_at(optimizer, whole, list(model.parameters()))
        self._attach(model, optimizer, collective)
        return model

    def after_step(self) -> None:
        self._replica = None  # evaluation's whole copy is stale after a step
        self.comm.add(0.0, self._step_bytes, self._step_bytes)

    # -- whole states -----------------------------------------------------------------------------

    def model_state(self) -> dict[str, Any]:
        """The whole model's state dict on rank 0, on the CPU (every rank must call it; the
        others get an empty dict)."""
        if not _is_sharded(self._sharded):
            return super().model_state()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        model = self.unwrap()
        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return trainable_state(model, whole)

    def result_state(self, rank: int) -> bytes | None:
        """This rank's own shard of every parameter (rank 0 adds the buffers, which every rank
        holds whole): no rank gathers the whole model for ``fit``'s result, the driver joins the
        shards (:func:`sparkdp.state.join_parts`). Under hsdp only the first replica's ranks send
        theirs; a rank with nothing to send returns None."""
        if not _is_sharded(self._sharded):
            return super().result_state(rank)
        from torch.distributed.tensor import DTensor

        mine: dict[str, torch.Tensor] = {}
        pieces: dict[str, tuple[int, int, int]] = {}
        model = self.unwrap()
        for name, value in trainable_state(model, model.state_dict()).items():
            if not isinstance(value, DTensor):
                if rank == 0:
                    mine[name] = value
                continue
            where = _dim0_shard(value)
            if where is None:  # a layout other than dim-0 shards: gathered, one tensor at a time
                whole = value.full_tensor()
                if rank == 0:
                    mine[name] = whole
            elif where[2]:
                mine[name], pieces[name] = value.to_local(), (*where[:2], value.shape[0])
        if not mine and rank != 0:
            return None
        return state_io.part_to_bytes(mine, pieces)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """The optimizer's whole state on rank 0, keyed by parameter name (every rank calls it)."""
        if not _is_sharded(self._sharded):
            return super().optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return dict(
            get_optimizer_state_dict(
                self.unwrap(), optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        )

    def load_optimizer_state(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a whole optimizer state (:meth:`optimizer_state`'s, written by any number of
        ranks): each rank keeps its shard of it."""
        if not _is_sharded(self._sharded):
            return super().load_optimizer_state(optimizer, state)
        assert self._sharded is not None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if state.get("param_groups") and not isinstance(state["param_groups"][0]["params"][0], str):
            raise ConfigError(
                "this optimizer state was saved by another strategy (keyed by parameter index); "
                "strategy='fsdp' resumes from states that fsdp saved (keyed by parameter name)."
            )
        # the loop loads it before setup(): the sharded module is known from shard()
        set_optimizer_state_dict(
            self._sharded, optimizer, state, options=StateDictOptions(full_state_dict=True)
        )
        return None

    def saves_shards(self) -> bool:
        """Each rank writes its own shards to the job's checkpoints (``sharded_checkpoints``),
        once the model is sharded (one worker saves its whole state)."""
        return self.sharded_checkpoints and _is_sharded(self._sharded)

    def evaluation(self, collective: Collective, last: bool) -> tuple[nn.Module, Collective] | None:
        """A whole copy of the model on every rank (sharded forwards would need every rank to run
        as many evaluation batches as every other); each rank evaluates its share with it."""
        if not _is_sharded(self._sharded):
            return super().evaluation(collective, last)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        whole = get_model_state_dict(self.unwrap(), options=StateDictOptions(full_state_dict=True))
        assert self._skeleton is not None
        replica = copy.deepcopy(self._skeleton)
        replica.load_state_dict(whole, assign=True)
        self._replica = replica
        return replica, collective

    def finish(self) -> None:
        self._replica = None
        super().finish()

    def options(self) -> dict[str, Any]:
        return {
            "reshard_after_forward": self.reshard_after_forward,
            "min_params": self.min_params,
            "param_dtype": self.param_dtype,
            "reduce_dtype": self.reduce_dtype,
            "sharded_checkpoints": self.sharded_checkpoints,
            "shard_units": len(self._units) + 1,
        }

    def __getstate__(self) -> dict[str, Any]:
        # shipped to the workers before setup: the sharded module and its meta copy stay behind
        return {
            **self.__dict__,
            "_sharded": None,
            "_skeleton": None,
            "_replica": None,
            "model": None,
            "optimizer": None,
            "collective": None,
            "_hook": None,
        }


def shard_units(model: nn.Module, min_params: int) -> list[str]:
    """Names of the submodules to shard one by one, innermost first (``fully_shard`` needs the
    children before their parents): every transformer block (the built-in GPT's, or a Hugging
    Face model's ``_no_split_modules`` classes), else every submodule holding ``min_params``
    or more parameters not already in a unit. The root is not listed (it is always sharded last)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [
        name
        for name, module in model.named_modules()
        if name and (isinstance(module, BLOCK_CLASSES) or type(module).__name__ in names)
    ]
    if blocks:
        return [name for name in blocks if not any(name.startswith(other + ".") for other in blocks)][::-1]
    units: list[str] = []
    covered: set[int] = set()
    for name, module in _post_order(model):
        if not name:
            continue
        mine = [p for p in module.parameters() if id(p) not in covered]
        if sum(p.numel() for p in mine) >= min_params:
            units.append(name)
            covered.update(id(p) for p in mine)
    return units


def adapter_units(model: nn.Module) -> list[str]:
    """Where a model trains only part of itself (LoRA adapters on a frozen base), the largest
    submodules that hold trainable parameters only, each its own shard unit: every unit is then
    all trainable or all frozen, so a float32 adapter never shares a unit's flat all-gather with
    a bfloat16 base, and a frozen unit reduces no gradients. Containers (``ModuleDict``,
    ``ModuleList``) are never units (their forward is never called), their members are."""
    if not frozen_names(model):
        return []
    units: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        params = list(module.parameters())
        container = isinstance(module, nn.ModuleDict | nn.ModuleList)
        if prefix and params and not container and all(p.requires_grad for p in params):
            units.append(prefix)
            return
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return units


def _post_order(module: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        out.extend(_post_order(child, f"{prefix}.{name}" if prefix else name))
    out.append((prefix, module))
    return out


def _meta_copy(model: nn.Module) -> nn.Module:
    """``model``'s structure with every parameter and buffer on the meta device (no memory)."""
    memo: dict[int, Any] = {
        id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for p in model.parameters()
    }
    memo.update({id(b): torch.empty_like(b, device="meta") for b in model.buffers()})
    return copy.deepcopy(model, memo)


def _point_at(optimizer: Optimizer, whole: list[nn.Parameter], shards: list[nn.Parameter]) -> None:
    """Make ``optimizer`` step the shards where it held the whole parameters (same order)."""
    shard_of = {id(p): s for p, s in zip(whole, shards)}
    for group in optimizer.param_groups:
        missing = [p for p in group["params"] if id(p) not in shard_of]
        if missing:
            raise ConfigError(
                "the optimizer holds parameters that are not the model's; build it with "
                "torch.optim.X(model.parameters(), ...) over the model you distribute."
            )
        group["params"] = [shard_of[id(p)] for p in group["params"]]


def _dim0_shard(value: Any) -> tuple[int, int, bool] | None:
    """Where a DTensor's local tensor lies when it is one of the mesh's dim-0 shards, replicated
    over any other mesh dimensions (fsdp's and hsdp's layout): (shard index, shard count, whether
    this rank is in the first replica); None for any other layout."""
    from torch.distributed.tensor import Replicate, Shard

    placements = value.placements
    shards = [i for i, p in enumerate(placements) if type(p) is Shard and p.dim == 0]
    if len(shards) != 1 or not all(i in shards or isinstance(p, Replicate) for i, p in enumerate(placements)):
        return None
    coordinate = value.device_mesh.get_coordinate()
    assert coordinate is not None  # every rank of the job is in the mesh
    first = all(c == 0 for i, c in enumerate(coordinate) if i != shards[0])
    return coordinate[shards[0]], value.device_mesh.size(shards[0]), first


def _is_sharded(model: nn.Module | None) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"fsdp: {name} must be true or false; got {value!r}.")
    return value


def _dtype_name(option: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in PARAM_DTYPES:
        raise ConfigError(f"fsdp: {option} must be one of {', '.join(sorted(PARAM_DTYPES))}; got {value!r}.")
    return value.lower()
