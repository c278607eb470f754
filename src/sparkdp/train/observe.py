"""What a launched script does with ``torch.distributed`` and its optimizers, seen from outside.

A script that never calls :func:`~sparkdp.distribute` (a ``torchrun`` script, Hugging Face
``Trainer`` or ``accelerate``) still trains distributed when it communicates over the task's
process group, and still deserves monitoring. While it runs, :class:`ScriptObserver`

* wraps ``torch.distributed``'s collectives and point-to-point calls (in ``torch.distributed``
  and ``distributed_c10d``, so the object collectives' inner calls count too) to count them,
  their time and bytes;
* follows every ``DistributedDataParallel`` the script builds: a comm hook that times and
  counts each gradient bucket's reduction (wrapping the script's own comm hook, if it registers
  one), and a forward pre-hook that counts the rows of training batches;
* counts every ``optimizer.step()`` of any optimizer (torch's global step post-hook) as one
  step for the live monitor.

Whether the workers trained together is judged by what happened: a collective over more than
one rank, or a DDP module over such a group. Nothing here counts while the script uses
``sparkdp.distribute``, whose strategy reports its own communication and steps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..strategies.allreduce import ExposedWait, timed_group_hook
from ..strategies.base import CommMeter, ring_bytes
from .context import current

#: bytes a rank moves for a payload of ``n`` bytes among ``w`` ranks, by collective
_RING = ("all_reduce", "all_reduce_coalesced")
_GATHER = ("all_gather", "all_gather_into_tensor", "_all_gather_base")
_SHARE = (
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
)
_WHOLE = ("broadcast", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv")
#: the argument holding what a rank contributes, by name (the first present counts)
_INPUTS = ("input_tensor", "input", "input_list", "input_tensor_list", "tensors", "tensor")


def _payload_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_payload_bytes(v) for v in value)
    return 0


def _wire_bytes(name: str, payload: int, world: int) -> int:
    if name in _RING:
        return ring_bytes(payload, world)
    if name in _GATHER:
        return (world - 1) * payload
    if name in _SHARE:
        return (world - 1) * payload // max(world, 1)
    return payload


def _first_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The batch size of a forward call: the first dimension of its first tensor argument."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0


class _Watched:
    """One DDP module the script built: its reductions' exposed wait and bucket bytes since the last step."""

    def __init__(self, module: DistributedDataParallel) -> None:
        self.world = dist.get_world_size(module.process_group)
        self.group = module.process_group
        self.wait = ExposedWait()
        self.bucket_bytes = 0
        self.hooked = False


def _counted_hook(state, bucket):  # noqa: ANN001, ANN201 (unannotated: DDP checks a hook's annotations)
    """DDP comm hook: ``hook(hook_state, bucket)`` (the script's own, or torch's all-reduce),
    its bucket's bytes counted and its reduction timed."""
    hook_state, hook, watched, inside = state
    buffer = bucket.buffer()
    watched.bucket_bytes += buffer.numel() * buffer.element_size()
    inside.depth = 1  # the collectives the hook calls are this bucket's, counted here
    try:
        return timed_group_hook((hook_state, hook, watched.wait), bucket)
    finally:
        inside.depth = 0


class ScriptObserver:
    """Counts a launched script's communication and steps while :meth:`watching` (see the module)."""

    def __init__(self, probe: Any = None) -> None:
        self.probe = probe
        self.meter = CommMeter()
        #: whether the script communicated with other ranks (a collective, or a DDP over them)
        self.communicated = False
        self.steps = 0
        self._ddps: list[_Watched] = []
        self._rows = 0
        self._last_step: float | None = None
        self._inside = threading.local()  # a wrapped call made from another one counts once

    def comm_stats(self) -> dict[str, float]:
        return {
            "comm_s": self.meter.seconds,
            "bytes_sent": self.meter.sent,
            "bytes_recv": self.meter.received,
        }

    @staticmethod
    def _sparkdp_distributes() -> bool:
        return bool(current().active)

    @contextmanager
    def watching(self) -> Iterator[ScriptObserver]:
        """Observe while the block runs; everything is put back afterwards."""
        with ExitStack() as stack:
            for namespace in (dist, c10d):
                for name in (*_RING, *_GATHER, *_SHARE, *_WHOLE):
                    original = getattr(namespace, name, None)
                    if original is not None:
                        stack.enter_context(_replaced(namespace, name, self._collective(name, original)))
            stack.enter_context(
                _replaced(
                    DistributedDataParallel, "__init__", self._ddp_init(DistributedDataParallel.__init__)
                )
            )
            stack.callback(register_optimizer_step_post_hook(self._stepped).remove)
            self._last_step = time.perf_counter()
            yield self

    # -- collectives ---------------------------------------------------------------------------
    def _collective(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        signature = inspect.signature(original)

        def observed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "depth", 0) or self._sparkdp_distributes():
                return original(*args, **kwargs)
            self._inside.depth = 1
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self._inside.depth = 0
                self._count(name, signature, args, kwargs, time.perf_counter() - started)

        observed.__wrapped__ = original  # type: ignore[attr-defined]
        return observed

    def _count(
        self, name: str, signature: Any, args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float
    ) -> None:
        try:
            bound = signature.bind(*args, **kwargs).arguments
            world = dist.get_world_size(bound.get("group"))
        except (TypeError, ValueError, RuntimeError):  # a call torch refused, or no group
            return
        if world < 2:
            return
        self.communicated = True
        payload = next((_payload_bytes(bound[key]) for key in _INPUTS if key in bound), 0)
        wire = _wire_bytes(name, payload, world)
        self.meter.add(seconds, wire, wire)

    # -- DDP modules ---------------------------------------------------------------------------
    def _ddp_init(self, original: Callable[..., None]) -> Callable[..., None]:
        def init(module: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            if not self._sparkdp_distributes():
                self._watch(module)

        return init

    def _watch(self, module: DistributedDataParallel) -> None:
        watched = _Watched(module)
        if watched.world < 2:
            return
        self.communicated = True
        self._ddps.append(watched)
        register = module.register_comm_hook

        def register_own(state: object, hook: Callable[..., Any]) -> None:
            # the script's hook runs inside the counting one (DDP takes one hook per module)
            watched.hooked = True
            register((state, hook, watched, self._inside), _counted_hook)

        module.register_comm_hook = register_own  # type: ignore[method-assign]

        def before_forward(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not watched.hooked:  # the script registered none before its first forward: torch's all-reduce
                watched.hooked = True
                register((watched.group, default_hooks.allreduce_hook, watched, self._inside), _counted_hook)
            if mod.training and torch.is_grad_enabled():
                self._rows += _first_rows(args, kwargs)
                if self.steps == 0:  # the first step's time starts at its forward, not at the script's start
                    self._last_step = time.perf_counter()

        module.register_forward_pre_hook(before_forward, with_kwargs=True)

    # -- steps ---------------------------------------------------------------------------------
    def _stepped(self, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self._sparkdp_distributes():
            return
        for watched in self._ddps:
            wire = ring_bytes(watched.bucket_bytes, watched.world)
            watched.bucket_bytes = 0
            self.meter.add(watched.wait.take(), wire, wire)
        now = time.perf_counter()
        seconds, self._last_step = now - (self._last_step or now), now
        rows, self._rows = self._rows, 0
        self.steps += 1
        if self.probe is not None:
            self.probe.step_done(seconds, rows, None)


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


__all__ = ["ScriptObserver"]
