"""sparkdp's CUDA paths, without Spark or Java.

Runs under ``make test-gpu`` (``pytest -m gpu``) on a machine with a CUDA GPU; skipped without
one. Neither pyspark nor Java is needed: the workers' code runs as a Spark task would run it,
in spawned processes or in the test's own process.

Checked, each against an independent reference (hand-worked numbers, one process on the
same data and device with ``torch.optim``, or the same run on the CPU):

* ``task_device``: a task's GPU address becomes the current CUDA device; bad addresses are
  refused with ``EnvironmentProblem``; a LOCAL_RANK that is not that device's ordinal is told.
* ``TorchCollective`` on a CUDA device picks NCCL; its collectives keep CUDA tensors on the GPU
  and give the known values (world size 1: NCCL refuses two ranks on one GPU).
* AllReduce and ParameterAveraging(period=1, averaged optimizer state), two gloo ranks with
  CUDA tensors on one GPU: both ranks end with the parameters of one process trained on the
  concatenated batches, and neither uses the shared-memory transport (host memory only).
* The asynchronous strategy (asgd) with its model on the GPU, pushing to a real parameter
  server over TCP: a push moves the server by the hand-worked amount, a whole task loop equals
  torch SGD, and the worker's model stays on the GPU.
* One Spark task's body (``in_task`` + ``fit_worker``) trains a small CNN on the GPU to the
  losses and parameters the same run reaches on the CPU.
* ``precision="fp16-mixed"``: the loop's scaled backward, unscale, clipping and scaler step give
  the parameters of a hand-written ``torch.amp`` loop; ``"bf16-mixed"`` computes in bfloat16 and
  trains, parameters staying float32.

``SPARKDP_TEST_DEVICE=cpu`` runs the tests that do not need CUDA on the CPU instead (a check of
the tests themselves on a machine without a GPU); the CUDA-only ones then skip.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from sparkdp.comm import IndependentCollective
from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.errors import EnvironmentProblem
from sparkdp.ps import ParameterServer
from sparkdp.ps.transport import TcpTransport
from sparkdp.strategies import AsyncParameterServer
from sparkdp.train.jobs import task_device
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.optim import optimizer_factory, resolve_loss
from tests.gpu import workers
from tests.helpers.dist import run_workers

#: where the tests compute; only a self-check of the tests sets SPARKDP_TEST_DEVICE (to "cpu")
DEVICE = os.environ.get("SPARKDP_TEST_DEVICE", "cuda:0")
ON_CUDA = torch.device(DEVICE).type == "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="needs CUDA"),
]
needs_cuda = pytest.mark.skipif(not ON_CUDA, reason="checks CUDA itself; SPARKDP_TEST_DEVICE is not a GPU")

#: float32 on a GPU: other kernels and summation orders than the CPU's, well inside these
ATOL, RTOL = 1e-4, 1e-4
STEPS, BATCH, WORLD = 8, 4, 2


def _assert_close(got, want, what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} tensors, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.detach().cpu(), w.detach().cpu()
        assert torch.allclose(g, w, atol=atol, rtol=rtol), (
            f"{what}: tensor {i} differs by {(g - w).abs().max():.3g}"
        )


def _gpus() -> tuple[str, ...]:
    """The GPU addresses Spark would give a task computing on DEVICE."""
    device = torch.device(DEVICE)
    return (str(device.index or 0),) if device.type == "cuda" else ()


def _run_alone(fn, *args, timeout_s: float = 240):
    """``fn(*args)`` in a fresh spawned process (its own CUDA context and process group)."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(fn, args).get(timeout=timeout_s)


# --- task_device ------------------------------------------------------------------------------


@needs_cuda
def test_task_device_makes_the_assigned_gpu_current():
    assert task_device(("0",)) == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0


@needs_cuda
def test_task_device_takes_the_first_of_several_addresses_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="sparkdp.train.jobs"):
        assert task_device(("0", "1")) == torch.device("cuda", 0)
    assert "spark.task.resource.gpu.amount=1" in caplog.text


@needs_cuda
def test_a_tasks_local_rank_names_its_gpu_or_it_is_told():
    # scripts (torchrun's, accelerate's) compute on cuda:LOCAL_RANK: it must be the task's GPU
    agreed = _run_alone(workers.local_rank_and_device, ("0",), 0)
    assert (agreed["LOCAL_RANK"], agreed["current"], agreed["warned"]) == ("0", 0, [])
    apart = _run_alone(workers.local_rank_and_device, ("0",), 1)
    assert apart["current"] == 0 and apart["LOCAL_RANK"] == "1"
    assert any("but its LOCAL_RANK is 1" in w for w in apart["warned"]), apart["warned"]


@needs_cuda
def test_task_device_refuses_a_gpu_this_process_cannot_see():
    with pytest.raises(EnvironmentProblem, match="CUDA_VISIBLE_DEVICES"):
        task_device((str(torch.cuda.device_count()),))


def test_task_device_refuses_an_address_that_is_not_an_ordinal():
    # a discovery script may report GPU UUIDs; torch needs the ordinal, checked before CUDA is touched
    with pytest.raises(EnvironmentProblem, match="ordinals"):
        task_device(("GPU-5c1e9a7b",))


# --- NCCL at world size 1 ---------------------------------------------------------------------


@needs_cuda
def test_a_cuda_collective_is_nccl_and_keeps_tensors_on_the_gpu():
    (got,) = run_workers(workers.collectives_on_device, 1, device=DEVICE)
    assert got["backend"] == "nccl" and "nccl" in got["group_backend"], got["group_backend"]
    assert set(got["devices"]) == {DEVICE} and got["stats_device"] == "cpu"
    # world size 1: sum, max and mean over one rank, and a broadcast from it, leave every value as it was
    expected = [
        torch.tensor([1.0, -2.0, 3.5]),
        torch.tensor([4.0, 0.5]),
        torch.full((2, 2), 3.0),
        torch.arange(3, dtype=torch.float64),
        torch.tensor([7.0, 8.0]),
    ]
    for i, (g, e) in enumerate(zip(got["values"], expected, strict=True)):
        assert g.dtype == e.dtype and torch.equal(g, e), f"tensor {i}: {g} != {e}"
    assert torch.equal(got["stats"], torch.tensor([2.5, 4.0], dtype=torch.float64))


# --- synchronous strategies: two gloo ranks, CUDA tensors, one GPU ----------------------------


@pytest.mark.parametrize(
    "strategy,transport_option", [("allreduce", "gradient_transport"), ("average", "parameter_transport")]
)
def test_two_ranks_on_one_gpu_equal_one_process_on_the_concatenated_batches(strategy, transport_option):
    ranks = run_workers(workers.train_sharded, WORLD, strategy, STEPS, BATCH, backend="gloo", device=DEVICE)
    reference = workers.single_process(DEVICE, STEPS, BATCH, WORLD)
    for rank, got in enumerate(ranks):
        assert got["device"] == DEVICE, f"rank {rank} trained on {got['device']}"
        # shared memory was asked for; it reduces host memory only, so CUDA tensors go through the group
        expected = "process-group" if ON_CUDA else "shared-memory"
        assert got["options"][transport_option] == expected, got["options"]
        _assert_close(got["params"], reference, f"{strategy} rank {rank} vs one process")
    # both ranks applied the same reduced values with the same kernels
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["params"], ranks[1]["params"])), "the ranks differ"


@pytest.mark.parametrize(
    "strategy,options,atol",
    [
        ("allreduce", {"compression": "bf16"}, 5e-3),  # sparkdp's own half-precision hook on gloo
        ("diloco", {"period": 2, "compression": "int8"}, 5e-3),  # quantised on the GPU, gathered by gloo
        ("diloco", {"period": 2, "compression": "bf16"}, 1e-2),
    ],
)
def test_compressed_strategies_on_the_gpu_stay_near_float32(strategy, options, atol):
    run = {**options, "shared_memory": False}
    plain = run_workers(
        workers.train_sharded,
        WORLD,
        strategy,
        STEPS,
        BATCH,
        {**run, "compression": "none"},
        backend="gloo",
        device=DEVICE,
    )
    ranks = run_workers(
        workers.train_sharded, WORLD, strategy, STEPS, BATCH, run, backend="gloo", device=DEVICE
    )
    for rank, got in enumerate(ranks):
        assert got["device"] == DEVICE and got["options"]["compression"] == options["compression"], got
        assert got["state_devices"] == (["cpu"] if strategy == "diloco" else []), got["state_devices"]
        _assert_close(got["params"], plain[rank]["params"], f"{strategy} {options} rank {rank}", atol=atol)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["params"], ranks[1]["params"])), "the ranks differ"


# --- the asynchronous strategy with its model on the GPU --------------------------------------


def _serve(model: nn.Module, strategy: AsyncParameterServer):
    """A parameter server holding ``model``'s parameters, with ``strategy``'s rule, behind TCP."""
    rule = strategy.rule_spec(1)
    server = ParameterServer(lambda shard: rule.create(), list(model.parameters()))
    transport = TcpTransport()
    return server, transport, transport.serve(server, host="127.0.0.1")


def test_an_asgd_push_from_a_gpu_model_moves_the_server_by_the_hand_worked_step():
    # w = [1, 2], x = [1, 1], target 0: loss (w.x)^2 = 9, gradient 2 (w.x) x = [6, 6].
    # The worker's SGD (lr 0.1) takes w to [0.4, 1.4]; it pushes (w_pulled - w) / lr = [6, 6];
    # the server's SGD (lr 0.5) takes the centre to [1, 2] - 0.5 [6, 6] = [-2, -1].
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    strategy = AsyncParameterServer("asgd", {"lr": 0.5})
    server, transport, endpoint = _serve(model, strategy)
    with endpoint:
        local = copy.deepcopy(model).to(DEVICE)
        opt = torch.optim.SGD(local.parameters(), lr=0.1)
        strategy.connect_to(transport, endpoint.info).setup(
            local, opt, IndependentCollective(0, 1, torch.device(DEVICE))
        )
        try:
            x, target = torch.ones(1, 2, device=DEVICE), torch.zeros(1, 1, device=DEVICE)
            strategy.add_samples(1)
            nn.functional.mse_loss(local(x), target).backward()
            opt.step()  # the strategy's hook pushes, then pulls the new centre
        finally:
            strategy.finish()
        centre = server.pull(worker=0, observe=True).tensors
        applied = server.metrics()["pushes_applied"]
    assert applied == 1
    _assert_close(centre, [torch.tensor([[-2.0, -1.0]])], "server centre", atol=1e-5)
    assert local.weight.device == torch.device(DEVICE), "the pull left the worker's model off its device"
    _assert_close([local.weight], [torch.tensor([[-2.0, -1.0]])], "worker after its pull", atol=1e-5)


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _torch_sgd(batches, lr: float) -> list[torch.Tensor]:
    """The reference: torch SGD on DEVICE over the same batches in the same order."""
    model = _tiny_model().to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x.to(DEVICE)), y.to(DEVICE)).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_the_async_task_loop_on_the_gpu_over_tcp_is_torch_sgd():
    """``fit_worker`` -- every asynchronous Spark task's loop -- with its model on the GPU: a plain SGD
    worker pushes its gradient, so the server's SGD(0.3) follows torch SGD(0.3) on the same batches."""
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    data, epochs, batch = TensorData(x, y), 2, 8
    model = _tiny_model()
    strategy = AsyncParameterServer("asgd", {"lr": 0.3})
    spec = FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.05, momentum=0.0),
        strategy=strategy,
        train=data,
        eval=None,
        training=TrainingConfig(epochs=epochs, batch_size=batch),
    )
    server, transport, endpoint = _serve(model, strategy)
    with endpoint:
        report = fit_worker(
            replace(spec, strategy=strategy.connect_to(transport, endpoint.info)),
            IndependentCollective(0, 1, torch.device(DEVICE)),
        )
        centre = server.pull(worker=0, observe=True).tensors
        metrics = server.metrics()
    batches = [
        (x[idx], y[idx])
        for epoch in range(epochs)
        for idx in data.shard_indices(rank=0, world_size=1, epoch=epoch, seed=0, shuffle=True).split(batch)
    ]
    _assert_close(centre, _torch_sgd(batches, lr=0.3), "server centre vs torch SGD")
    assert report.strategy_metrics["pushes"] == len(batches) == metrics["pushes_applied"]
    assert metrics["staleness"] == {0: len(batches)}  # one worker never pushes stale
    # fit_worker moved the model in place; every pull since copied the CPU wire's centre onto it
    assert {p.device for p in model.parameters()} == {torch.device(DEVICE)}
    _assert_close(
        list(model.parameters()), centre, "worker's model vs the centre it last pulled", atol=0, rtol=0
    )


# --- one Spark task's body: the CNN on the GPU against the CPU --------------------------------


def test_a_task_body_trains_the_cnn_on_the_gpu_as_on_the_cpu():
    epochs = 3
    gpu = _run_alone(workers.fit_cnn_as_a_task, _gpus(), epochs)
    cpu = _run_alone(workers.fit_cnn_as_a_task, (), epochs)
    assert (gpu["device"], gpu["trained_on"]) == (DEVICE, DEVICE)
    assert gpu["backend"] == ("nccl" if ON_CUDA else "gloo") and cpu["device"] == "cpu"
    losses = [[r[k] for r in run["history"] for k in ("loss", "test_loss")] for run in (gpu, cpu)]
    assert losses[1][-2] < 0.8 * losses[1][0], f"the CPU run did not learn: {losses[1]}"  # a test that trains
    _assert_close(
        [torch.tensor(losses[0])],
        [torch.tensor(losses[1])],
        "per-epoch losses, GPU vs CPU",
        atol=1e-4,
        rtol=1e-3,
    )
    # a row whose two best scores nearly tie may flip: allow two of them
    for g, c in zip(*([r["test_accuracy"] for r in run["history"]] for run in (gpu, cpu))):
        assert abs(g - c) <= 2 / workers.CNN_ROWS, f"test accuracy {g} on the GPU, {c} on the CPU"
    names = sorted(cpu["state"])
    assert sorted(gpu["state"]) == names
    _assert_close(
        [gpu["state"][n] for n in names],
        [cpu["state"][n] for n in names],
        "final weights, GPU vs CPU",
        atol=1e-3,
        rtol=1e-3,
    )


# --- mixed precision: fp16 with gradient scaling, bf16 ----------------------------------------


def _lm_spec(precision: str, clip: float | None):
    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import DictData
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train.loop import FitSpec
    from sparkdp.train.optim import optimizer_factory, resolve_loss
    from tests.train.lm_models import TinyCausalLM, token_data

    model = TinyCausalLM(seed=1)
    data = DictData(token_data(32))
    return FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("sgd", model, lr=0.5),
        strategy=resolve_strategy("allreduce"),
        train=data,
        eval=None,
        training=TrainingConfig(epochs=2, batch_size=8, precision=precision, clip_grad_norm=clip),
    )


@needs_cuda
def test_fp16_mixed_scales_unscales_clips_and_steps_as_a_hand_written_amp_loop():
    from sparkdp.train.loop import fit_worker
    from tests.train.lm_models import TinyCausalLM

    spec = _lm_spec("fp16-mixed", clip=0.1)
    fit_worker(spec, IndependentCollective(0, 1, torch.device(DEVICE)))
    assert spec.model.seen_dtype == torch.float16
    ref = TinyCausalLM(seed=1).to(DEVICE)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(2):
        for x, _ in spec.train.batches(rank=0, world_size=1, epoch=epoch, batch_size=8, seed=0):
            x = {k: v.to(DEVICE) for k, v in x.items()}
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = ref(**x).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
            scaler.step(opt)
            scaler.update()
    _assert_close(list(spec.model.parameters()), list(ref.parameters()), "fp16-mixed vs torch.amp by hand")


@needs_cuda
def test_bf16_mixed_trains_on_the_gpu_in_bfloat16():
    from sparkdp.train.loop import fit_worker

    spec = _lm_spec("bf16-mixed", clip=None)
    report = fit_worker(spec, IndependentCollective(0, 1, torch.device(DEVICE)))
    assert spec.model.seen_dtype == torch.bfloat16
    assert report.history[-1]["loss"] < report.history[0]["loss"]
    assert {p.dtype for p in spec.model.parameters()} == {torch.float32}
