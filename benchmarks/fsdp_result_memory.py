"""What returning fit's trained model costs each fsdp worker in memory, at the end of the job.

The GPT of tests/driver/test_out_of_memory_job.py (13.8M parameters, AdamW) trains one epoch
of 2 steps with ``fsdp`` on 4 gloo processes through ``fit_worker``, the loop every Spark task
runs; each rank then encodes its report as its task encodes it for the driver (the launcher's
result rows; its Arrow allocator warmed up first, as a task's input rows warm it). Per rank: the peak virtual size (VmPeak, what ``spark.executor.pyspark.memory``
limits) and peak resident set (VmHWM) when training is done, and again after its result is
encoded; the difference is what returning the model cost.

    python benchmarks/fsdp_result_memory.py
"""

from __future__ import annotations

import argparse

import torch


def _status() -> dict[str, int]:
    """VmPeak and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmPeak", "VmHWM"):
                out[key] = int(value.split()[0]) << 10
    return out


def _worker(coll, workers: int) -> dict[str, int]:
    import pyarrow

    # a Spark task has read its input rows through Arrow before training: its allocator's arena is
    # reserved (about 1 GiB of address space) before the result's rows are built
    pyarrow.array(range(4))

    from sparkdp.config import TrainingConfig
    from sparkdp.data.tensors import DictData
    from sparkdp.models.zoo import build_model
    from sparkdp.spark.launcher import _result_batch
    from sparkdp.strategies import STRATEGIES
    from sparkdp.train.loop import FitSpec, fit_worker
    from sparkdp.train.optim import optimizer_factory, resolve_loss

    torch.manual_seed(0)
    model = build_model("gpt", n_layer=6, d_model=384, n_head=8, block_size=64)
    ids = torch.randint(0, 8192, (8 * workers, 64), generator=torch.Generator().manual_seed(0))
    strategy = STRATEGIES.create("fsdp")
    marks: dict[str, dict[str, int]] = {}
    finish = strategy.finish

    def finish_marked() -> None:  # the loop calls it after the last step, before the result
        marks["trained"] = _status()
        finish()

    strategy.finish = finish_marked  # type: ignore[method-assign]
    spec = FitSpec(
        model=model,
        loss=resolve_loss("model"),
        optimizer=optimizer_factory("adamw", model),
        strategy=strategy,
        train=DictData({"input_ids": ids, "labels": ids}),
        eval=None,
        training=TrainingConfig(epochs=1, batch_size=4, seed=0),
        prefetch=0,
    )
    report = fit_worker(spec, coll)
    if report is not None:
        _result_batch("bench", coll.rank, report)
    del report
    marks["returned"] = _status()
    return {f"{key}_{mark}": value for mark, values in marks.items() for key, value in values.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()
    from tests.helpers.dist import run_workers

    rows = run_workers(_worker, args.workers, args.workers, timeout_s=600)
    mib = 1 << 20
    print(
        f"gpt 13.8M, fsdp on {args.workers} workers: memory at the end of training and after the result (MiB)"
    )
    print(
        f"{'rank':>4} {'VmPeak trained':>15} {'returned':>9} {'+':>6} {'VmHWM trained':>14} {'returned':>9} {'+':>6}"
    )
    for rank, r in enumerate(rows):
        print(
            f"{rank:4d} {r['VmPeak_trained'] / mib:15.0f} {r['VmPeak_returned'] / mib:9.0f} "
            f"{(r['VmPeak_returned'] - r['VmPeak_trained']) / mib:6.0f} {r['VmHWM_trained'] / mib:14.0f} "
            f"{r['VmHWM_returned'] / mib:9.0f} {(r['VmHWM_returned'] - r['VmHWM_trained']) / mib:6.0f}"
        )


if __name__ == "__main__":
    main()
