"""A synchronous worker told to stop (SIGTERM) saves at the next step boundary and stops with
WorkerPreempted on every rank; a second signal still kills; the driver's notice does what a
signal does."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from sparkdp.comm.single import IndependentCollective, SingleProcessCollective
from sparkdp.train import preempt
from sparkdp.train.preempt import PreemptionWatch, Stop, watch_preemption
from tests.helpers.dist import run_workers

pytestmark = pytest.mark.timeout(120)

STEPS_PER_EPOCH = 8  # 128 rows / 2 workers / 8 rows a step


def _spec(checkpoint_dir: str | None, fault: str | None, epochs: int = 2):
    from sparkdp.config import CheckpointConfig, TrainingConfig
    from sparkdp.data.tensors import TensorData
    from sparkdp.strategies import resolve_strategy
    from sparkdp.train.checkpoint import CheckpointPolicy
    from sparkdp.train.faults import fault_from_env
    from sparkdp.train.loop import FitSpec
    from sparkdp.train.optim import optimizer_factory, resolve_loss

    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.randn(128, 5, generator=g), torch.randint(0, 3, (128,), generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("sgd", model, lr=0.1, momentum=0.9),
        strategy=resolve_strategy("allreduce", shared_memory=False),
        train=data,
        eval=None,
        training=TrainingConfig(epochs=epochs, batch_size=8),
        checkpoint=CheckpointPolicy(CheckpointConfig(checkpoint_dir), job_id="preempt-test")
        if checkpoint_dir
        else None,
        fault=fault_from_env({"SPARKDP_FAULT": fault}) if fault else None,
    )


def _train(coll, checkpoint_dir: str, fault: str | None):
    from sparkdp.errors import WorkerPreempted
    from sparkdp.train import preempt
    from sparkdp.train.loop import fit_worker

    preempt.AGREE_EVERY_S = 0  # an agreement at every step: the stop's step is exact

    before = signal.getsignal(signal.SIGTERM)
    spec = _spec(checkpoint_dir, fault)
    try:
        fit_worker(spec, coll)
        outcome = "finished"
    except WorkerPreempted as exc:
        outcome = str(exc)
    restored = signal.getsignal(signal.SIGTERM) is before
    return {
        "outcome": outcome,
        "restored": restored,
        "params": [p.detach().clone() for p in spec.model.parameters()],
    }


@pytest.mark.distributed
def test_sigterm_to_one_rank_saves_at_the_next_step_boundary_and_stops_every_rank(tmp_path):
    from sparkdp.train.checkpoint import latest_checkpoint

    signalled_after = 5  # rank 1 gets SIGTERM after its 5th step (of 8 in epoch 1)
    out = run_workers(_train, 2, str(tmp_path), f"term:rank=1:step={signalled_after}", timeout_s=90)
    assert [o["outcome"] for o in out] == [
        "preempted: worker 1 received SIGTERM or SIGHUP (its executor or machine is going away); saved a "
        "checkpoint at epoch 1, step 6"
    ] * 2
    assert all(o["restored"] for o in out)  # the handlers in place before training are back
    saved = latest_checkpoint(str(tmp_path))
    assert saved is not None and saved.epoch == 0
    # agreeing at every step, the stop comes one step after the signal: the reduction started at
    # the step the signal arrived in is read at the next boundary
    assert saved.step == signalled_after + 1
    # what was saved is what rank 0 trained up to that step
    for name, p in zip(saved.model, out[0]["params"], strict=True):
        torch.testing.assert_close(saved.model[name], p, rtol=0, atol=0)


def test_a_second_sigterm_kills_the_worker_as_before():
    script = textwrap.dedent("""
        import os, signal, time
        from sparkdp.comm.single import SingleProcessCollective
        from sparkdp.train.preempt import watch_preemption
        with watch_preemption(SingleProcessCollective()) as watch:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            assert watch.signal == signal.SIGTERM  # the first one only asks
            print("asked", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        print("survived", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["asked"], proc.stderr
    assert proc.returncode == -signal.SIGTERM


def test_the_drivers_notice_flags_rank_0_and_the_agreement_reports_it(monkeypatch):
    monkeypatch.setattr(preempt, "AGREE_EVERY_S", 0)  # an agreement at every step
    posted = {"now": False}
    watch = PreemptionWatch(SingleProcessCollective(), notice=lambda: posted["now"])
    assert watch.install()
    try:
        assert watch.step_boundary() is None and watch.step_boundary() is None
        posted["now"] = True
        deadline = time.monotonic() + 10
        while not watch.noticed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.step_boundary() is None  # this boundary's reduction carries the flag...
        assert watch.step_boundary() == Stop(signalled=(), noticed=True)  # ...read at the next one
    finally:
        watch.restore()


def test_no_watch_for_asynchronous_workers():
    with watch_preemption(IndependentCollective(0, 2)) as watch:
        assert watch is None


def test_agreements_come_about_every_agree_every_s_at_the_cadence_rank_0_proposes(monkeypatch):
    monkeypatch.setattr(preempt, "AGREE_EVERY_S", 0.05)
    started = []
    coll = SingleProcessCollective()
    real = coll.start_all_reduce
    monkeypatch.setattr(coll, "start_all_reduce", lambda t, op="sum": (started.append(1), real(t, op))[1])
    watch = PreemptionWatch(coll)
    for _ in range(40):  # steps of 10 ms or more: an agreement every 5 steps or fewer
        time.sleep(0.01)
        assert watch.step_boundary() is None
    # one at the first boundary, one at the second (the first step time measured), then one
    # every int(0.05 s / step time) <= 5 steps: far fewer than the 40 steps, however slow the machine
    assert 8 <= len(started) <= 20, len(started)
    watch.signal = signal.SIGTERM
    steps = 0
    while watch.step_boundary() is None and steps < 20:
        time.sleep(0.01)
        steps += 1
    assert steps <= 6  # the next agreement (at most 5 steps away), read at the boundary after it
