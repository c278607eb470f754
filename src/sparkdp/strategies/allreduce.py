"""Horovod-style synchronous training: average gradients every step with DDP.

DistributedDataParallel buckets gradients (``bucket_cap_mb``) and starts each
bucket's all-reduce while backward is still computing earlier layers, so
communication overlaps computation. Every rank applies the same optimizer step
to the same averaged gradient, so any ``torch.optim`` optimizer works and the
run equals single-process training on the concatenated batch (docs/algorithms.md §2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from ..comm.base import Collective
from ..comm.shm import DEFAULT_SLOT_BYTES, REDUCIBLE, SharedMemoryReducer
from ..config import check_int
from ..errors import ConfigError
from .base import CommMeter, Strategy, ring_bytes
from .compression import HALF_DTYPES, check_codec

#: buckets smaller than this stay on gloo: shared memory's two barriers (more than two ranks)
#: cost more than gloo's one message (0.97 against 0.66 ms for 256 KB; 1.97 against 5.70 ms
#: for 4 MB, benchmarks/allreduce_transport.py); two ranks' single barrier draws level with
#: gloo at 256 KB, so the threshold loses them nothing
SHARED_MEMORY_MIN_BYTES = 1 << 20


class AllReduce(Strategy):
    """Gradient all-reduce every step.

    Args:
        bucket_cap_mb: DDP bucket size; larger buckets mean fewer, bigger messages
            (raise it for models with many small tensors on a high-latency network).
        find_unused_parameters: set True when some parameters get no gradient in
            a step (e.g. conditional branches); it costs an extra graph traversal.
        gradient_as_bucket_view: let each ``.grad`` be a view into DDP's communication
            bucket, so the gradient is neither copied into the bucket before the
            all-reduce nor back after it. Same arithmetic; on the 2-conv CNN (gloo,
            2 processes, 1 thread each) a step took 101-112 ms instead of 113-120 ms.
            Set False if your loop calls ``detach_()`` on gradients or keeps ``.grad``
            tensors across steps (PyTorch's DDP documents both restrictions).
        shared_memory: when every rank is on one host (``local[N]``, or co-located
            executors) and trains on CPU, all-reduce the gradient buckets through a
            shared mapping instead of gloo's TCP (``sparkdp.comm.shm``): 13 MB took
            6.9 ms instead of 16.5 ms (medians, benchmarks/allreduce_transport.py).
            Ranks on different hosts use the process
            group either way, and so do buckets under ``shared_memory_min_bytes``
            (1 MiB), where gloo's single message is as quick as shared memory's barriers.
        compression: how gradients travel: ``"none"`` (float32), ``"bf16"`` or ``"fp16"``
            (half the bytes, through shared memory too; torch's compress hooks on the
            process group), or ``"powersgd"`` (Vogels et al., 2019: each matrix-shaped
            gradient sent as two rank-``powersgd_rank`` factors with error feedback, through
            torch's PowerSGD hook on the process group; vectors go uncompressed).
        powersgd_rank: PowerSGD's approximation rank (1 sends least; 2-4 lose less accuracy).
        powersgd_start_step: PowerSGD sends full gradients for this many steps first (its
            authors' advice: compress only once the loss has left its first, steepest part).
    """

    name = "allreduce"

    def __init__(
        self,
        bucket_cap_mb: float = 25.0,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        shared_memory: bool = True,
        shared_memory_min_bytes: int = SHARED_MEMORY_MIN_BYTES,
        compression: str = "none",
        powersgd_rank: int = 2,
        powersgd_start_step: int = 10,
    ) -> None:
        super().__init__()
        if bucket_cap_mb <= 0:
            raise ConfigError(f"bucket_cap_mb must be > 0; got {bucket_cap_mb}.")
        self.compression = check_codec(compression, ("none", "bf16", "fp16", "powersgd"))
        check_int("allreduce: powersgd_rank", powersgd_rank)
        check_int("allreduce: powersgd_start_step", powersgd_start_step, 2)
        self.powersgd_rank, self.powersgd_start_step = powersgd_rank, powersgd_start_step
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.shared_memory = bool(shared_memory)
        self.shared_memory_min_bytes = int(shared_memory_min_bytes)
        self._wrapped: nn.Module | None = None
        self._reducer: SharedMemoryReducer | None = None
        self._step_bytes = 0
        self._steps = 0
        self._powersgd_bytes = 0
        self._wait: ExposedWait | None = None

    def setup(self, model: nn.Module, optimizer: Optimizer, collective: Collective) -> nn.Module:
        self._attach(model, optimizer, collective)
        if collective.world_size == 1:
            self._wrapped = model
            return model
        device_ids = [collective.device.index] if collective.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters and buffers on construction.
        self._wrapped = DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
        )
        grads = [p for p in model.parameters() if p.requires_grad]
        half = HALF_DTYPES.get(self.compression)
        if self.shared_memory and self.compression != "powersgd":
            # one slot holds the largest bucket: at most every gradient, at most 16 MiB
            grad_bytes = sum(p.numel() * p.element_size() for p in grads)
            self._reducer = SharedMemoryReducer.connect(
                collective, slot_bytes=min(DEFAULT_SLOT_BYTES, grad_bytes)
            )
            if self._reducer is not None:
                self._wrapped.register_comm_hook(
                    (self._reducer, self.shared_memory_min_bytes, self.comm, half), _shared_memory_hook
                )
                self._transport = "shared-memory"
        if self._reducer is None:
            # the process group reduces every bucket; the hook also times how long backward waits for it
            inner: tuple[Any, Any] = (None, default_hooks.allreduce_hook)
            if half is not None:
                inner = (half, _half_precision_hook)
            elif self.compression == "powersgd":
                inner = (
                    powerSGD_hook.PowerSGDState(
                        process_group=None,
                        matrix_approximation_rank=self.powersgd_rank,
                        start_powerSGD_iter=self.powersgd_start_step,
                    ),
                    powerSGD_hook.powerSGD_hook,
                )
                self._powersgd_bytes = ring_bytes(
                    _powersgd_values(grads, self.powersgd_rank) * 4, collective.world_size
                )
            self._wait = ExposedWait()
            self._wrapped.register_comm_hook((*inner, self._wait), timed_group_hook)
        width = 2 if half is not None else 4
        self._step_bytes = ring_bytes(sum(p.numel() for p in grads) * width, collective.world_size)
        return self._wrapped

    def after_step(self) -> None:
        # the gradients' bytes on the wire, and the seconds backward waited for the process
        # group's reductions (the shared-memory hook times its own)
        self._steps += 1
        compressed = self._powersgd_bytes and self._steps > self.powersgd_start_step
        wire = self._powersgd_bytes if compressed else self._step_bytes
        self.comm.add(self._wait.take() if self._wait is not None else 0.0, wire, wire)

    def finish(self) -> None:
        self._reducer = None  # unmaps the shared slots once DDP lets go of its hook state
        super().finish()

    def options(self) -> dict[str, Any]:
        return {
            "bucket_cap_mb": self.bucket_cap_mb,
            "gradient_as_bucket_view": self.gradient_as_bucket_view,
            "shared_memory": self.shared_memory,
            "compression": self.compression,
            **(
                {"powersgd_rank": self.powersgd_rank, "powersgd_start_step": self.powersgd_start_step}
                if self.compression == "powersgd"
                else {}
            ),
            "gradient_transport": self._transport,
        }


def _powersgd_values(grads: Sequence[torch.Tensor], rank: int, min_compression_rate: float = 2.0) -> int:
    """Values PowerSGD all-reduces per step once compressing: each matrix-shaped gradient (an
    ``n × m`` view) as ``(n + m) · rank`` factor values when that is under half its size (torch's
    ``min_compression_rate`` rule), every other gradient whole."""
    total = 0
    for p in grads:
        n = p.shape[0] if p.dim() > 1 else 0
        m = p.numel() // n if n else 0
        small = (n + m) * rank * min_compression_rate < n * m
        total += (n + m) * rank if n and small else p.numel()
    return total


def _shared_memory_hook(state: tuple[SharedMemoryReducer, int, CommMeter, torch.dtype | None], bucket):  # noqa: ANN001, ANN201
    """DDP comm hook: average one gradient bucket through shared memory (synchronously: the
    reduction is a few memory passes, shorter than handing the bucket to another thread),
    in ``half`` precision when the job compresses to it.

    Unannotated on purpose: DDP rejects annotations other than the GradBucket and Future
    classes themselves, and this module's annotations are strings."""
    reducer, min_bytes, meter, half = state
    buffer = bucket.buffer()
    started = time.perf_counter()
    if buffer.numel() * buffer.element_size() < min_bytes or buffer.dtype not in REDUCIBLE:
        # gloo, asynchronous, as DDP does by default; timed until it completes (it overlaps backward)
        # None is the default group: torch's allreduce_hook handles it but annotates ProcessGroup
        reduced = (
            default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
            if half is None
            else _half_precision_hook(half, bucket)
        )
        return reduced.then(lambda done: _timed(done, meter, started))
    future: torch.futures.Future = torch.futures.Future()
    try:
        if half is None:
            future.set_result(reducer.all_reduce_(buffer, 1.0 / reducer.world))
        else:
            sent = buffer.to(half)
            reducer.all_reduce_(sent, 1.0 / reducer.world)
            future.set_result(buffer.copy_(sent))
    except Exception as exc:  # DDP re-raises it from backward()
        future.set_exception(exc)
    meter.add(time.perf_counter() - started)
    return future


def _half_precision_hook(half, bucket):  # noqa: ANN001, ANN201 (unannotated: see _shared_memory_hook)
    """DDP comm hook: average one bucket in ``half`` precision over the process group, without
    blocking backward. (torch's own bf16 hook refuses gloo, though gloo reduces bf16.)"""
    buffer = bucket.buffer()
    sent = buffer.to(half).div_(dist.get_world_size())
    future = dist.all_reduce(sent, async_op=True).get_future()
    return future.then(lambda done: buffer.copy_(done.value()[0]))


class ExposedWait:
    """How long a step's backward waited for the process group: from the launch of its last
    bucket's reduction (its last gradients were ready) until the last reduction completed.
    The reductions of earlier buckets overlap backward's compute and cost nothing until then;
    waiting for a slower rank counts, as it does in every synchronous strategy's communication."""

    def __init__(self) -> None:
        self.launched = self.done = 0.0

    def take(self) -> float:
        waited = max(self.done - self.launched, 0.0)
        self.launched = self.done = 0.0
        return waited


def timed_group_hook(state, bucket):  # noqa: ANN001, ANN201 (unannotated: see _shared_memory_hook)
    """DDP comm hook: the inner hook's reduction of one bucket, noting when it was launched
    and when it completed (:class:`ExposedWait`)."""
    inner_state, inner, wait = state
    reduced = inner(inner_state, bucket)
    wait.launched = time.perf_counter()

    def completed(done):  # noqa: ANN001, ANN202
        wait.done = time.perf_counter()
        return done.value()

    return reduced.then(completed)


def _timed(done, meter: CommMeter, started: float):  # noqa: ANN001, ANN202
    meter.add(time.perf_counter() - started)
    return done.value()
