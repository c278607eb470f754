"""Worker functions for the hsdp and zero1 tests (module level so spawn can import them).

Each worker also trains the same model alone, in-process, on every global batch whole
(``torch.optim.AdamW``): the reference the distributed run must reproduce."""

from __future__ import annotations

import os
from typing import Any

import torch

from sparkdp import state as state_io
from sparkdp.models.zoo import build_model
from sparkdp.strategies import STRATEGIES
from sparkdp.train.memory import local_bytes, model_state_bytes

ROWS = 16  # rows of a global batch, split evenly over the ranks
LR = 1e-3


def _batches(steps: int, rows: int) -> torch.Tensor:
    return torch.randint(0, 256, (steps, rows, 16), generator=torch.Generator().manual_seed(1))


def _model(state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model("gpt-tiny")
    if state is not None:
        model.load_state_dict(state)
    return model


def _clip(opt: torch.optim.Optimizer, clip: float | None) -> float:
    """Clip the gradients of the optimizer's parameters as the training loop does
    (``train.step``); their norm before clipping."""
    if clip is None:
        return 0.0
    params = [p for group in opt.param_groups for p in group["params"]]
    return float(torch.nn.utils.clip_grad_norm_(params, clip))


def reference(
    batches: torch.Tensor, fresh_at: int | None = None, clip: float | None = None
) -> dict[str, Any]:
    """One process, AdamW on each global batch whole: the loss of every step, the final model
    and optimizer. ``fresh_at``: a new optimizer (no moments) from that step on; ``clip``: the
    gradients clipped to that norm."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for step, x in enumerate(batches):
        if step == fresh_at:
            opt = torch.optim.AdamW(model.parameters(), lr=LR)
        opt.zero_grad(set_to_none=True)
        loss = model(x, labels=x)["loss"]
        loss.backward()
        norms.append(_clip(opt, clip))
        opt.step()
        losses.append(loss.item())
    return {
        "losses": torch.tensor(losses, dtype=torch.float64),
        "norms": norms,
        "model": model,
        "optimizer": opt,
        "state_bytes": model_state_bytes(model, opt),
    }


def _global_step(coll, net, opt, batch: torch.Tensor, clip: float | None = None) -> float:
    """This rank's rows of ``batch``; the mean loss over the ranks (the whole batch's)."""
    share = len(batch) // coll.world_size
    x = batch[coll.rank * share : (coll.rank + 1) * share]
    opt.zero_grad(set_to_none=True)
    loss = net(x, labels=x)["loss"]
    loss.backward()
    _clip(opt, clip)
    opt.step()
    total = loss.detach().reshape(1).double()
    coll.all_reduce(total, "mean")
    return float(total)


def _optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(local_bytes(v) for values in opt.state.values() for v in values.values())


def _share(coll, directory: str, obj: Any = None) -> Any:
    """Rank 0 writes ``obj`` as sparkdp state bytes (None: a run before did), every rank reads
    it back (a checkpoint)."""
    path = os.path.join(directory, "state.bin")
    if coll.rank == 0 and obj is not None:
        state_io.save(obj, path)
    coll.barrier()
    return state_io.load(path)


def _pretend_hosts(coll, hosts: list[str]) -> None:
    """Set torchrun's variables as if rank r ran on host ``hosts[r]`` (as the launcher would)."""
    from sparkdp.comm.torchrun_env import Place, placements, torchrun_env

    placement = placements([Place(h) for h in hosts])[coll.rank]
    os.environ.update(torchrun_env(placement, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))


def hsdp_then_resume(coll, directory: str, steps: int, shard_size: int, resume_hosts: list[str]):
    """``steps`` hsdp steps in groups of ``shard_size``; the whole model and optimizer state
    gathered and saved, loaded into a fresh hsdp whose groups are the hosts ``resume_hosts``
    names, 2 more steps. Losses, bytes, states (and this rank's share of fit's result) and the
    reference's."""
    batches = _batches(steps + 2, ROWS)
    strategy = STRATEGIES.create("hsdp", shard_size=shard_size, min_params=1)
    model = strategy.shard(_model(), coll)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    net = strategy.setup(model, opt, coll)
    losses = [_global_step(coll, net, opt, batches[s]) for s in range(steps)]
    state_bytes = model_state_bytes(model, opt)
    whole, moments = strategy.model_state(), strategy.optimizer_state(opt)
    share = strategy.result_state(coll.rank)  # what this rank sends for fit's result
    options = strategy.options()
    strategy.finish()
    saved = _share(coll, directory, {"model": whole, "optimizer": moments})
    _pretend_hosts(coll, resume_hosts)
    again = STRATEGIES.create("hsdp", min_params=1)
    model = again.shard(_model(saved["model"]), coll)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    again.load_optimizer_state(opt, saved["optimizer"])
    net = again.setup(model, opt, coll)
    resumed = [_global_step(coll, net, opt, batches[s]) for s in (steps, steps + 1)]
    resumed_options = again.options()
    again.finish()
    out = {
        "losses": torch.tensor(losses + resumed, dtype=torch.float64),
        "share": share,
        "state_bytes": state_bytes,
        "options": options,
        "resumed_options": resumed_options,
        "resumed_mesh": again.device_mesh(coll).mesh.tolist(),
    }
    if coll.rank == 0:  # the references (the losses are every rank's mean, the same on all)
        ref = reference(batches)
        out["reference"] = ref["losses"]
        out["reference_bytes"] = ref["state_bytes"]
        out["fresh_moments"] = reference(batches, fresh_at=steps)["losses"]
        at_save = reference(batches[:steps])  # the reference where the run saved
        ref_state = at_save["optimizer"].state
        named = dict(at_save["model"].named_parameters())
        out["model"] = whole
        out["reference_model"] = at_save["model"].state_dict()
        out["moments"] = {k: v["exp_avg_sq"] for k, v in moments["state"].items()}
        out["reference_moments"] = {k: ref_state[p]["exp_avg_sq"] for k, p in named.items()}
    return out


def zero1_steps(coll, directory: str, steps: int, start: int = 0, clip: float | None = None):
    """zero1 from step ``start`` (0: fresh; else from the state a run before saved in
    ``directory``) to ``steps``, saving the whole model and optimizer state there at the end;
    ``clip``: gradients clipped to that norm over the optimizer's parameters, as the loop does."""
    batches = _batches(steps, ROWS)
    strategy = STRATEGIES.create("zero1")
    saved = _share(coll, directory) if start else None
    model = strategy.shard(_model(saved["model"] if saved else None), coll)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if saved:
        strategy.load_optimizer_state(opt, saved["optimizer"])
    net = strategy.setup(model, opt, coll)
    losses = []
    for step in range(start, steps):
        losses.append(_global_step(coll, net, opt, batches[step], clip))
        if step == start:
            state_bytes, optimizer_bytes = model_state_bytes(model, opt), _optimizer_bytes(opt)
    gathered = strategy.optimizer_state(opt)
    whole = {k: v.detach().clone() for k, v in strategy.unwrap().state_dict().items()}
    strategy.finish()
    coll.barrier()
    _share(coll, directory, {"model": whole, "optimizer": gathered})
    out = {
        "losses": torch.tensor(losses, dtype=torch.float64),
        "state_bytes": state_bytes,
        "optimizer_bytes": optimizer_bytes,
        "sent": strategy.comm_stats()["bytes_sent"],
        "options": strategy.options(),
        "gathered": gathered,
    }
    if coll.rank == 0:  # the references (the losses are every rank's mean, the same on all)
        ref = reference(batches, clip=clip)
        out["reference"] = ref["losses"][start:]
        out["reference_norms"] = ref["norms"]
        out["fresh_moments"] = reference(batches, fresh_at=start)["losses"][start:] if start else None
        out["reference_bytes"] = ref["state_bytes"]
        out["reference_optimizer_bytes"] = _optimizer_bytes(ref["optimizer"])
        out["reference_state"] = ref["optimizer"].state_dict()
    return out
