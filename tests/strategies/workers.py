"""Worker functions for the distributed strategy tests (module level so spawn can import them)."""

from __future__ import annotations

import torch
from torch import nn

from sparkdp.strategies import AllReduce, ParameterAveraging


def make_problem(seed: int = 0, rows: int = 64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 5, generator=g)
    y = torch.randint(0, 3, (rows,), generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, x, y


def collective_sum(coll):
    t = torch.full((3,), float(coll.rank + 1))
    coll.all_reduce(t, "sum")
    same = torch.arange(4.0)  # rank-agnostic oracle: same tensor everywhere, sum = t * world
    coll.all_reduce(same, "sum")
    many = [torch.ones(2) * (coll.rank + 1), torch.ones(3, dtype=torch.float64) * 10]
    coll.all_reduce_coalesced(many, "mean")
    b = torch.full((2,), float(coll.rank))
    coll.broadcast(b, src=1)
    return {"sum": t, "same": same, "many": many, "bcast": b}


def train_slices(coll, model, opt, strategy, x, y, steps: int, batch: int) -> None:
    """Set ``strategy`` up, train ``steps`` steps, each rank on its slice of every global batch
    of ``world × batch`` rows, and finish."""
    net = strategy.setup(model, opt, coll)
    for step in range(steps):
        lo = (step * coll.world_size + coll.rank) * batch
        xb, yb = x[lo : lo + batch], y[lo : lo + batch]
        strategy.add_samples(len(xb))
        opt.zero_grad()
        nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
    strategy.finish()


def train_sharded(
    coll,
    strategy_name: str,
    steps: int,
    batch: int,
    optimizer: str,
    period: int = 1,
    average_state: bool = False,
    bucket_view: bool = True,
    shared_memory: bool = True,
    with_options: bool = False,
    compression: str = "none",
):
    """Each rank trains on its slice of every global batch; returns the final parameters."""
    model, x, y = make_problem()
    if coll.rank != 0:  # different local init: the strategy must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if optimizer == "sgd"
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if optimizer == "momentum"
        else torch.optim.Adam(model.parameters(), lr=0.01)
    )
    # every bucket of this tiny model through shared memory when it is on
    strategy = (
        AllReduce(gradient_as_bucket_view=bucket_view, shared_memory=shared_memory, shared_memory_min_bytes=0)
        if strategy_name == "allreduce"
        else ParameterAveraging(
            period=period,
            average_optimizer_state=average_state,
            shared_memory=shared_memory,
            shared_memory_min_bytes=0,
            compression=compression,
        )
    )
    train_slices(coll, model, opt, strategy, x, y, steps, batch)
    params = [p.detach().clone() for p in model.parameters()]
    return (params, strategy.options()) if with_options else params


def single_process(steps: int, batch: int, world: int, optimizer: str):
    """The reference: one process on the concatenated global batches."""
    model, x, y = make_problem()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if optimizer == "sgd"
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        if optimizer == "momentum"
        else torch.optim.Adam(model.parameters(), lr=0.01)
    )
    for step in range(steps):
        lo = step * batch * world
        xb, yb = x[lo : lo + batch * world], y[lo : lo + batch * world]
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_diloco(coll, steps: int, batch: int, options: dict, inner_lr: float = 0.1):
    """Each rank takes plain-SGD inner steps on its slice of every global batch under DiLoCo;
    returns the final parameters and the strategy's options and communication figures."""
    from sparkdp.strategies import DiLoCo

    model, x, y = make_problem()
    if coll.rank != 0:  # different local init: the strategy must broadcast rank 0's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=inner_lr)
    strategy = DiLoCo(**options)
    train_slices(coll, model, opt, strategy, x, y, steps, batch)
    return [p.detach().clone() for p in model.parameters()], strategy.options(), strategy.comm_stats()


def wide_problem(seed: int = 0, rows: int = 256):
    """A model with matrix-shaped gradients large enough for PowerSGD to compress (64 × 32)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 32, generator=g)
    y = torch.randint(0, 3, (rows,), generator=g)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 3)), x, y


def train_compressed(coll, compression: str, steps: int, batch: int, shared_memory: bool):
    """All-reduce training with compressed gradients; (None for coll: the one-process reference on
    the concatenated batches). Returns parameters, options and communication figures."""
    model, x, y = wide_problem()
    world = coll.world_size if coll is not None else 1
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    net, strategy = model, None
    if coll is not None:
        strategy = AllReduce(
            compression=compression,
            shared_memory=shared_memory,
            shared_memory_min_bytes=0,
            powersgd_start_step=2,
        )
        net = strategy.setup(model, opt, coll)
    for step in range(steps):
        if coll is None:
            xb, yb = (
                x[step * batch * 2 : (step + 1) * batch * 2],
                y[step * batch * 2 : (step + 1) * batch * 2],
            )
        else:
            lo = step * batch * world + coll.rank * batch
            xb, yb = x[lo : lo + batch], y[lo : lo + batch]
        opt.zero_grad()
        nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    if strategy is None:
        return params
    strategy.finish()
    return params, strategy.options(), strategy.comm_stats()


def train_one_rank_slow(coll, steps: int, delay_s: float, shared_memory: bool):
    """All-reduce training in which rank 1 computes ``delay_s`` longer before each backward;
    returns this rank's communication seconds and the transport."""
    import time

    model, x, y = wide_problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = AllReduce(shared_memory=shared_memory)
    net = strategy.setup(model, opt, coll)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[step * 8 : (step + 1) * 8]), y[step * 8 : (step + 1) * 8])
        if coll.rank == 1:
            time.sleep(delay_s)
        loss.backward()
        opt.step()
    strategy.finish()
    return strategy.comm_stats()["comm_s"], strategy.options()["gradient_transport"]
