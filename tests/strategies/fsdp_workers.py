"""Worker functions for the fsdp tests (module level so spawn can import them)."""

from __future__ import annotations

import torch
from torch import nn

from sparkdp.config import TrainingConfig
from sparkdp.data.tensors import TensorData
from sparkdp.models.zoo import build_model
from sparkdp.strategies import STRATEGIES
from sparkdp.train.loop import FitSpec, fit_worker
from sparkdp.train.memory import model_state_bytes
from sparkdp.train.optim import optimizer_factory, resolve_loss


def make(model_name: str, seed: int = 0):
    """A model (same init on every rank) and 20 steps' worth of rows for it."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if model_name == "gpt-tiny":
        return build_model("gpt-tiny"), torch.randint(0, 256, (160, 16), generator=g), None
    x = torch.randn(160, 1, 28, 28, generator=g)
    return build_model(model_name), x, torch.randint(0, 10, (160,), generator=g)


def step_losses(
    coll, strategy_name: str, model_name: str, steps: int = 20, batch: int = 4, options: dict | None = None
):
    """Each rank trains AdamW on its slice of every global batch; its losses, the final whole
    parameters (gathered) and its model-state bytes after the first step."""
    model, x, y = make(model_name)
    strategy = STRATEGIES.create(strategy_name, **(options or {}))
    model = strategy.shard(model, coll)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    net = strategy.setup(model, opt, coll)
    losses, state_bytes = [], 0
    for step in range(steps):
        lo = (step * coll.world_size + coll.rank) * batch
        opt.zero_grad(set_to_none=True)
        if y is None:
            loss = net(x[lo : lo + batch], labels=x[lo : lo + batch])["loss"]
        else:
            loss = nn.functional.cross_entropy(net(x[lo : lo + batch]), y[lo : lo + batch])
        loss.backward()
        opt.step()
        if step == 0:
            state_bytes = model_state_bytes(model, opt)
        losses.append(loss.item())
    whole = strategy.model_state()
    share = strategy.result_state(coll.rank)
    strategy.finish()
    return {
        "losses": torch.tensor(losses, dtype=torch.float64),
        "state": whole,
        "share": share,
        "state_bytes": state_bytes,
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "options": strategy.options(),
        "sent": strategy.comm_stats()["bytes_sent"],
    }


def _data(rows: int, seed: int) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    return TensorData(torch.randn(rows, 1, 28, 28, generator=g), torch.randint(0, 10, (rows,), generator=g))


def fit_spec(strategy_name: str, epochs: int = 2, **options) -> FitSpec:
    torch.manual_seed(0)
    model = build_model("cnn-small")
    return FitSpec(
        model=model,
        loss=resolve_loss("cross_entropy"),
        optimizer=optimizer_factory("adamw", model, lr=1e-3),
        strategy=STRATEGIES.create(strategy_name, **options),
        train=_data(96, 3),
        eval=_data(30, 4),
        training=TrainingConfig(epochs=epochs, batch_size=8, seed=5, memory_format="contiguous"),
        prefetch=0,
    )


def fit(
    coll, strategy_name: str, checkpoint_dir: str | None = None, keep: int = 10, options: dict | None = None
):
    """fit_worker's report as plain values (rank 0's; another rank's holds only its share of the
    model's state, or is None where the strategy does not shard it); with ``checkpoint_dir``,
    a checkpoint at every epoch end (``keep`` of them); ``options``: the strategy's."""
    from dataclasses import replace

    from sparkdp.config import CheckpointConfig
    from sparkdp.train.checkpoint import CheckpointPolicy

    spec = fit_spec(strategy_name, **(options or {}))
    if checkpoint_dir is not None:
        # one job identity on every rank, as the driver ships
        settings = CheckpointConfig(checkpoint_dir, keep_checkpoints=keep)
        spec = replace(spec, checkpoint=CheckpointPolicy(settings, "fit-job"))
    report = fit_worker(spec, coll)
    if report is None:
        return None
    return {"history": report.history, "state": report.state, "memory": report.memory}


def shares_and_gathered(coll, strategy_name: str, options: dict | None = None):
    """Two AdamW steps of a net whose rows do not split evenly over the ranks (an output layer of
    one row: some ranks hold none of it), with tied weights and a buffer; this rank's share of
    the state for fit's result, and the whole state gathered to rank 0."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(6, 5),
        nn.BatchNorm1d(5),
        nn.Tanh(),
        nn.Linear(5, 5),
        nn.Tanh(),
        nn.Linear(5, 5),
        nn.Linear(5, 1),
    )
    net[5].weight = net[3].weight
    strategy = STRATEGIES.create(strategy_name, **(options or {}))
    net = strategy.shard(net, coll)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net = strategy.setup(net, opt, coll)
    g = torch.Generator().manual_seed(1 + coll.rank)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        net(torch.randn(4, 6, generator=g)).square().mean().backward()
        opt.step()
    out = {"share": strategy.result_state(coll.rank), "gathered": strategy.model_state()}
    strategy.finish()
    return out


def _mlp():
    """A small net with tied weights (as a language model's head and embedding): a sharded
    checkpoint writes the shared tensor once and loads it into both."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(6, 32),
        nn.Tanh(),
        nn.Linear(32, 32),
        nn.Tanh(),
        nn.Linear(32, 32),
        nn.Tanh(),
        nn.Linear(32, 3),
    )
    net[4].weight = net[2].weight
    return net


def _global_step(coll, net, opt, x, y, step: int, rows: int) -> float:
    """One step on global batch ``step`` (``rows`` rows split evenly over the ranks); the mean loss."""
    share = rows // coll.world_size
    lo = step * rows + coll.rank * share
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(net(x[lo : lo + share]), y[lo : lo + share])
    loss.backward()
    opt.step()
    total = loss.detach().reshape(1).double()
    coll.all_reduce(total, "mean")
    return float(total)


def _problem():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(96, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def checkpoint_then_continue(coll, directory: str, steps: int, rows: int):
    """Train ``steps`` global steps with fsdp, save a sharded checkpoint (every rank its own
    shards, through the loop's saver), then take 2 more steps: their mean losses."""
    from sparkdp.config import CheckpointConfig
    from sparkdp.train.checkpoint import CheckpointPolicy, checkpoint_payload
    from sparkdp.train.loop import optimizer_state_to_bytes
    from sparkdp.train.sharded_checkpoint import ShardedSaver, split_tensors

    x, y = _problem()
    strategy = STRATEGIES.create("fsdp")  # one shard unit: the tied weights in it
    model = strategy.shard(_mlp(), coll)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    net = strategy.setup(model, opt, coll)
    for step in range(steps):
        _global_step(coll, net, opt, x, y, step, rows)
    assert strategy.saves_shards()
    state = strategy.sharded_state(model, opt)
    tensors, rest = split_tensors(state["optimizer"]["state"])
    saver = ShardedSaver(
        CheckpointPolicy(CheckpointConfig(directory), job_id="four-workers"), coll
    )  # one job on every rank
    saver.save(
        0,
        steps,
        model,
        {"model": state["model"], "optimizer": tensors},
        checkpoint_payload(
            epoch=0,
            step=steps,
            model={},
            optimizer=optimizer_state_to_bytes(
                opt, None, {"state": rest, "param_groups": state["optimizer"]["param_groups"]}
            ),
            strategy_state={},
            rng=[],
            history=[],
            workers=coll.world_size,
        ),
    )
    saver.close()
    return [_global_step(coll, net, opt, x, y, step, rows) for step in (steps, steps + 1)]


def _resume(coll, directory: str, steps: int, moments: bool):
    from sparkdp import state as state_io
    from sparkdp.train.checkpoint import latest_checkpoint
    from sparkdp.train.sharded_checkpoint import restore

    checkpoint = latest_checkpoint(directory)
    assert checkpoint is not None and checkpoint.step == steps and checkpoint.shards
    assert checkpoint.model == {}  # the weights are in the shards only
    strategy = STRATEGIES.create("fsdp")  # one shard unit: the tied weights in it
    model = strategy.shard(_mlp(), coll)  # fresh weights: the checkpoint's come from the shards
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    restore(checkpoint.shards, strategy, model, opt, state_io.from_bytes(checkpoint.optimizer)["optimizer"])
    if not moments:
        opt.state.clear()
    return strategy.setup(model, opt, coll), opt


def resume_and_continue(coll, directory: str, steps: int, rows: int):
    """Resume the sharded checkpoint of :func:`checkpoint_then_continue` (on any number of
    ranks) and take the same 2 global steps: their mean losses; then the same with the
    optimizer's moments dropped (the test's negative control)."""
    x, y = _problem()
    runs = []
    for moments in (True, False):
        net, opt = _resume(coll, directory, steps, moments)
        runs.append([_global_step(coll, net, opt, x, y, step, rows) for step in (steps, steps + 1)])
    return runs


def fit_resumed(coll, checkpoint_dir: str):
    """fit_worker resumed from the newest checkpoint in ``checkpoint_dir`` (as the driver's
    restart does), saving into it as the same job: the report as plain values (as ``fit``'s)."""
    from dataclasses import replace

    from sparkdp.config import CheckpointConfig
    from sparkdp.driver.recovery import resumed
    from sparkdp.train.checkpoint import CheckpointPolicy, latest_checkpoint

    checkpoint = latest_checkpoint(checkpoint_dir)
    assert checkpoint is not None
    policy = CheckpointPolicy(CheckpointConfig(checkpoint_dir, keep_checkpoints=10), checkpoint.job_id)
    spec = replace(resumed(fit_spec("fsdp"), checkpoint, coll.world_size), checkpoint=policy)
    report = fit_worker(spec, coll)
    if report is None:
        return None
    return {"history": report.history, "state": report.state}
