"""A launched script that never calls ``sparkdp.distribute``: whether its workers trained together
is judged by what it did (``sparkdp.train.observe``), and its steps, rows and bytes are counted,
against hand-worked figures, on two gloo ranks."""

from __future__ import annotations

import textwrap

import pytest

from sparkdp.train.context import WorkerContext, set_current
from sparkdp.train.script_runner import run_script
from tests.helpers.dist import run_workers

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

# every rank all-reduces two 8-value float32 tensors itself: 32 bytes each, 2 (N-1)/N of them on
# the wire at N = 2 (a ring), 64 bytes in all; object collectives count their inner all_gather
ALL_REDUCE = """
    import torch, torch.distributed as dist
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
"""

# trains alone: an optimizer and no collective (a barrier is no exchange of data)
ALONE = """
    import torch, torch.distributed as dist
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad(); model(torch.ones(5, 4)).sum().backward(); opt.step()
    dist.barrier()
"""

# DDP over the group: Linear(4, 2) holds 10 float32 values (40 bytes), one bucket a step, 40 bytes
# on the wire at N = 2; 3 steps of 5 rows, then an evaluation forward that trains on nothing
DDP = """
    import torch
    from torch.nn.parallel import DistributedDataParallel
    torch.distributed.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad(); model(torch.ones(5, 4)).sum().backward(); opt.step()
    with torch.no_grad():
        model(torch.ones(7, 4))
    torch.distributed.destroy_process_group()
"""

# the script's own comm hook runs inside the counting one: its bucket counted, its result kept
DDP_OWN_HOOK = """
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    calls = []
    def hook(state, bucket):
        calls.append(1)
        return default_hooks.allreduce_hook(state, bucket)
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad(); model(torch.ones(3, 4)).sum().backward(); opt.step()
    assert len(calls) == 2, calls
"""


class _Recorder:
    """A monitoring probe that keeps what the observer tells it."""

    active = True

    def __init__(self) -> None:
        self.steps, self.rows = 0, 0
        self.comm_stats = lambda: {
            "comm_s": 0.0,
            "bytes_sent": 0,
            "bytes_recv": 0,
        }  # until the observer sets its own

    def step_done(self, seconds: float, rows: int, loss: float | None) -> None:
        assert seconds >= 0 and loss is None
        self.steps += 1
        self.rows += rows

    def output(self, stream: str, text: str) -> None: ...


SCRIPTS = {"all_reduce": ALL_REDUCE, "alone": ALONE, "ddp": DDP, "ddp-own-hook": DDP_OWN_HOOK}


def _run_all(collective, directory: str) -> dict:
    """Every script in turn on this rank (one spawn of the two ranks for them all)."""
    from sparkdp.strategies.allreduce import AllReduce

    seen = {}
    for name, source in SCRIPTS.items():
        path = f"{directory}/{name}_{collective.rank}.py"
        with open(path, "w") as f:
            f.write(textwrap.dedent(source))
        probe = _Recorder()
        set_current(
            WorkerContext(collective.rank, collective.world_size, collective, AllReduce(), probe=probe)
        )
        try:
            result = run_script(path, [], directory)
        finally:
            set_current(None)
        seen[name] = {
            "distributed": result["distributed"],
            "steps": probe.steps,
            "rows": probe.rows,
            "bytes_sent": probe.comm_stats()["bytes_sent"],
            "bytes_recv": probe.comm_stats()["bytes_recv"],
        }
    return seen


def test_what_the_script_did_decides_and_is_counted(tmp_path):
    expected = {  # (distributed, steps, rows, bytes on the wire each way): see each script
        "all_reduce": (True, 0, 0, 64),
        "alone": (False, 3, 0, 0),
        "ddp": (True, 3, 15, 3 * 40),
        "ddp-own-hook": (True, 2, 6, 2 * 40),
    }
    for result in run_workers(_run_all, 2, str(tmp_path), timeout_s=90):
        got = {name: (r["distributed"], r["steps"], r["rows"], r["bytes_sent"]) for name, r in result.items()}
        assert got == expected
        assert all(r["bytes_recv"] == r["bytes_sent"] for r in result.values())
