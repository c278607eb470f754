"""Trace an asynchronous update rule push by push: why does (or doesn't) it train?

M workers take turns (round-robin, so every push has staleness M-1) on real Fashion-MNIST,
each with its own model copy and its own worker optimizer (SGD, lr 0.05,
momentum 0.9), exchanging through the real ParameterServer and the in-process transport
with the real AsyncWorker. For every push it prints the centre's norm, the pushed
tensor's norm against the raw mini-batch gradient's, the update the server applied,
the rule's effective momentum for that delay and, for delay-compensated rules, the
size of the compensation term. Deterministic (one thread), so runs are comparable.

    python benchmarks/async_rule_trace.py --rule ddcasgd --pushes 40
    python benchmarks/async_rule_trace.py --rule dcasgd --pushes 300 --every 50
"""

from __future__ import annotations

import argparse
import copy
import math

import torch

from sparkdp.data.datasets import dataset_tensors, load_dataset
from sparkdp.models import build_model
from sparkdp.ps import ParameterServer
from sparkdp.ps.transport.inproc import InProcTransport
from sparkdp.rules import DDCASGD, RULES, functional
from sparkdp.rules import dcasgd as dcasgd_module
from sparkdp.rules import ddcasgd as ddcasgd_module
from sparkdp.strategies.async_ps import AsyncParameterServer, AsyncWorker


def _norm(tensors) -> float:
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in tensors))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rule", default="ddcasgd", help=f"one of {', '.join(RULES.available())}")
    p.add_argument(
        "--rule-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="rule hyper-parameter (float), repeatable",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--model", default="cnn-small")
    p.add_argument("--pushes", type=int, default=40, help="total pushes to trace")
    p.add_argument("--every", type=int, default=1, help="print every N-th push")
    p.add_argument(
        "--lr",
        type=float,
        default=0.05,
        help="worker SGD learning rate (default 0.05, as in the figures of docs/algorithms.md)",
    )
    p.add_argument("--momentum", type=float, default=0.9, help="worker SGD momentum (CLI default 0.9)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval-rows", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0, help="seeds the model's initial weights and the data order")
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    ds = load_dataset("fashion-mnist")
    train, test = dataset_tensors(ds)
    model = build_model(args.model)
    options = {k: float(v) for k, v in (o.split("=", 1) for o in args.rule_option)}
    strategy = AsyncParameterServer(args.rule, options)
    spec = strategy.rule_spec(args.workers)
    rule0 = spec.create()

    # Record the compensation term where the rules compute it (the module-level name they call).
    comp: list[float] = []
    original = functional.delay_compensation

    def traced(g, displacement, strength, kappa=math.inf):
        c = original(g, displacement, strength, kappa)
        comp.append(float(c.norm() / (g.norm() + 1e-12)))
        return c

    ddcasgd_module.delay_compensation = traced
    dcasgd_module.delay_compensation = traced

    server = ParameterServer(lambda shard: spec.create(), list(model.parameters()), num_shards=1)
    transport = InProcTransport()
    endpoint = transport.serve(server)
    workers = []
    for m in range(args.workers):
        local = copy.deepcopy(model)
        opt = torch.optim.SGD(local.parameters(), lr=args.lr, momentum=args.momentum)
        client = transport.connect(endpoint.info.address, endpoint.info.secret, m)
        batches = train.batches(
            rank=m, world_size=args.workers, epoch=0, batch_size=args.batch_size, seed=args.seed, shuffle=True
        )
        workers.append((local, opt, AsyncWorker(strategy, client, local, opt, args.workers), batches))

    momentum = getattr(rule0, "momentum", 0.0)
    print(
        f"rule {args.rule} ({type(rule0).__name__}), server lr {getattr(rule0, 'lr', None)}, server momentum "
        f"{momentum}; worker SGD lr {args.lr} momentum {args.momentum}; {args.workers} workers round-robin"
    )
    print(
        f"{'push':>5} {'tau':>4} {'|centre|':>9} {'|push|':>9} {'|grad|':>8} {'push/grad':>9} "
        f"{'|update|':>9} {'mu_tau':>7} {'|c|/|g|':>8} {'loss':>7}"
    )
    for n in range(args.pushes):
        local, opt, runner, batches = workers[n % args.workers]
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(local(x), y)
        loss.backward()
        grad_norm = _norm([q.grad for q in local.parameters()])
        opt.step()
        before = [c.clone() for c in server.pull(worker=args.workers).tensors]  # an id no worker uses
        pushed: list[float] = []
        push = runner.client.push

        def spy(seq, versions, tensors, _push=push, pushed=pushed, **kw):
            pushed.append(_norm(tensors))
            return _push(seq, versions, tensors, **kw)

        runner.client.push = spy
        comp.clear()
        staleness_before = dict(server.metrics().get("staleness", {}))
        runner.after_step(len(x))
        runner.client.push = push
        after = server.pull(worker=args.workers).tensors
        staleness = dict(server.metrics().get("staleness", {}))
        tau = next((t for t, c in staleness.items() if c > staleness_before.get(t, 0)), -1)
        mu = (
            functional.momentum_for_delay(tau, momentum)
            if isinstance(rule0, DDCASGD) and tau >= 0
            else momentum
        )
        if n % args.every == 0 or n == args.pushes - 1:
            update = _norm([a - b for a, b in zip(after, before)])
            ratio = max(comp) if comp else float("nan")
            pn = pushed[0] if pushed else float("nan")
            print(
                f"{n:5d} {tau:4d} {_norm(after):9.3f} {pn:9.3f} {grad_norm:8.3f} {pn / grad_norm:9.2f} "
                f"{update:9.4f} {mu:7.3f} {ratio:8.3f} {loss.item():7.3f}"
            )
    with torch.no_grad():
        for q, c in zip(model.parameters(), server.pull(worker=args.workers).tensors):
            q.copy_(c)
        xs, ys = next(test.eval_batches(rank=0, world_size=1, batch_size=args.eval_rows))
        acc = float((model(xs).argmax(1) == ys).float().mean())
    print(f"centre after {args.pushes} pushes: test accuracy {acc:.3f} on {args.eval_rows} test rows")
    endpoint.close()


if __name__ == "__main__":
    main()
