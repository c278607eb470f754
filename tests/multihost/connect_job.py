"""Run on the test bed's client host: ``python connect_job.py sc://HOST:PORT JOB.json``.

A Spark Connect client: connects to the server, records where the server's executors run,
trains each of the job's ``fits`` (sparkdp.fit keyword arguments) on the built-in CNN and
Fashion-MNIST arrays with live monitoring asked for, calls ``sparkdp.run`` with each of its
``run_strategies``, and prints one ``RESULT {json}`` line with each fit's history, where its
parameter servers ran and the warnings sparkdp gave, and each call's result or error."""

from __future__ import annotations

import json
import logging
import socket
import sys
import time


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _task_host(_batches):
    import pyarrow as pa

    yield pa.RecordBatch.from_pydict({"hostname": [socket.gethostname()]})


def _rank_plus_one():
    from sparkdp.train.context import current

    return current().rank + 1


def main() -> None:
    remote, job = sys.argv[1], json.loads(open(sys.argv[2]).read())
    import sparkdp
    from sparkdp.data.datasets import fashion_mnist
    from sparkdp.models import build_model

    kept = Kept()
    logging.getLogger("sparkdp").addHandler(kept)
    spark = sparkdp.session(remote=remote)
    out = {
        "client": socket.gethostname(),
        "connect": type(spark).__module__,
        "executors": sorted(
            r.hostname
            for r in spark.range(2, numPartitions=2)
            .mapInArrow(_task_host, "hostname string", barrier=True)
            .collect()
        ),
        "runs": [],
    }
    data = fashion_mnist(limit=job.get("limit", 2000))
    for fit in job["fits"]:
        kept.messages.clear()
        started = time.monotonic()
        run: dict = {}
        try:
            result = sparkdp.fit(
                build_model("cnn"),
                (data.x_train, data.y_train),
                eval_data=(data.x_test, data.y_test),
                spark=spark,
                show_progress=True,
                **fit,
            )
            run["history"] = result.history
            run["servers"] = [s.get("host") for s in result.details.get("servers") or []]
        except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
            run["error"] = {"type": type(exc).__name__, "message": str(exc)}
        run["seconds"] = time.monotonic() - started
        run["warnings"] = list(kept.messages)
        out["runs"].append(run)
    out["calls"] = []
    for strategy in job.get("run_strategies", []):  # sparkdp.run of a function of the user's own
        started = time.monotonic()
        try:
            call = {
                "result": sparkdp.run(
                    _rank_plus_one, strategy=strategy, workers=1, spark=spark, show_progress=False
                )
            }
        except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
            call = {"error": {"type": type(exc).__name__, "message": str(exc)}}
        out["calls"].append({"strategy": strategy, "seconds": time.monotonic() - started, **call})
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
