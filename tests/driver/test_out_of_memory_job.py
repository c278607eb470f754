"""A transformer whose whole replica does not fit a worker's memory limit: allreduce fails at
once with the one line that names fsdp, and ``fit`` trains the same model, optimizer and batches
sharded with fsdp on 4 workers under the same limit and returns the whole trained model.

The limit is Spark's own ``spark.executor.pyspark.memory``, which PySpark applies to every Python
worker as its address-space rlimit (RLIMIT_AS), in local mode too. RLIMIT_AS counts virtual
memory, and a worker that has imported torch and joined a gloo group maps about 2.3 GiB before
the model's state: measured on 4 workers of ``local[4]`` with the GPT below (13.8M parameters,
AdamW: 211 MiB of state per replica, 53 MiB per fsdp shard), the workers' peak virtual size
(VmPeak) while training was 2.56-2.65 GiB under allreduce and 2.37-2.41 GiB under fsdp, so
2.5 GiB lies between the two.

No worker gathers the whole model for ``fit``'s result: each sends its own shards and the driver
joins them (``Strategy.result_state``, ``sparkdp.state.join_parts``), so the end of the job needs
at most a few shard-sized buffers more than training on any worker (13 MiB shards here;
benchmarks/fsdp_result_memory.py).
Gathering it on rank 0 instead (the whole state dict, its safetensors bytes and the task's
encoded result at once) ran rank 0 out of this limit. ``max_restarts=0``: no checkpoints, whose
host-memory snapshot of each worker's shards and optimizer state would be another copy of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(400)]

LIMIT = "2560m"

JOB = textwrap.dedent("""
    import json, sys
    import torch
    from safetensors.torch import load_file
    import sparkdp
    from sparkdp.errors import WorkerOutOfMemory
    from sparkdp.models import build_model

    def gpt():
        torch.manual_seed(0)
        return build_model("gpt", n_layer=6, d_model=384, n_head=8, block_size=64)

    spark = sparkdp.session("local[4]", conf={"spark.executor.pyspark.memory": sys.argv[1]}, log_level="OFF")
    ids = torch.randint(0, 8192, (32, 64), generator=torch.Generator().manual_seed(0))
    out = {}
    try:
        sparkdp.fit(gpt(), {"input_ids": ids, "labels": ids}, loss="model", optimizer="adamw",
                    strategy="allreduce", workers=4, epochs=1, batch_size=4, spark=spark,
                    show_progress=False, max_restarts=3)
        out["allreduce"] = {"trained": True}
    except WorkerOutOfMemory as exc:
        out["allreduce"] = {"error": str(exc), "limit": exc.limit_bytes}

    result = sparkdp.fit(gpt(), {"input_ids": ids, "labels": ids}, loss="model", optimizer="adamw",
                         strategy="fsdp", workers=4, epochs=1, batch_size=4, spark=spark,
                         show_progress=False, max_restarts=0)
    init, trained = gpt().state_dict(), result.model.state_dict()
    saved = load_file(result.save(sys.argv[2]))  # one consolidated file
    out["fsdp"] = {
        "loss": result.history[-1]["loss"],
        "state": max(m["model_state_bytes"] for m in result.details["memory"]),
        "names": list(trained) == list(init) and list(saved) == sorted(init),
        "shapes": all(trained[k].shape == init[k].shape == saved[k].shape for k in init),
        "entries": len(trained),
        "unchanged": sorted(k for k in init if torch.equal(trained[k], init[k])),
        "saved": all(torch.equal(saved[k], trained[k]) for k in init),
        "finite": all(bool(torch.isfinite(v).all()) for v in trained.values()),
    }
    print("RESULT " + json.dumps(out))
""")


def test_allreduce_runs_out_of_memory_with_one_line_naming_fsdp_whose_fit_trains_and_returns_it(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", JOB, LIMIT, str(tmp_path / "model.safetensors")],
        capture_output=True,
        text=True,
        timeout=380,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    failed = out["allreduce"]
    assert "error" in failed, failed
    assert failed["limit"] == 2560 << 20
    # 13,817,856 parameters x 4 bytes x (weights, gradients, AdamW's two moments) = 211 MiB
    assert "\n" not in failed["error"]
    assert failed["error"].endswith(
        "ran out of memory (limit 2.5 GiB): the model's state needs about 211 MiB per replica; "
        "strategy='fsdp' shards it over the workers (docs/guide/strategies.md)"
    ), failed["error"]
    assert "-- restart" not in proc.stderr  # not restarted: the same settings would run out again
    trained = out["fsdp"]
    # two AdamW steps from ln(8192) = 9.0 on random tokens; each worker held a quarter of the state
    assert 0 < trained["loss"] < 10, trained
    assert trained["state"] <= 0.26 * 13_817_856 * 16
    # the whole model came back trained: its 77 entries in the model's shapes, every one moved by
    # the two steps (AdamW's weight decay moves even untouched embedding rows), and the file
    # TrainResult.save wrote holds the same
    assert trained["entries"] == 77 and trained["unchanged"] == [], trained
    assert trained["names"] and trained["shapes"] and trained["saved"] and trained["finite"], trained
