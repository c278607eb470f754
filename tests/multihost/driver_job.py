"""Run on the test bed's driver host: ``python driver_job.py MASTER_URL JOB.json``.

Starts a session on MASTER_URL (with the job's ``conf``), records where the driver and every
executor run (hostname, network namespace, the address the hostname resolves to), trains the
job's ``fit`` arguments with sparkdp.fit on the built-in CNN and Fashion-MNIST (as arrays, or
with ``"input": "dataframe"`` as a Spark DataFrame of the same rows, evaluated on a Parquet file), and prints one
``RESULT {json}`` line; a failure is reported there too, with its type and message."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path


def where() -> dict:
    name = socket.gethostname()
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        resolved = None
    return {"hostname": name, "netns": os.stat("/proc/self/ns/net").st_ino, "resolves_to": resolved}


def _task_where(_rows):
    yield where()


def main() -> None:
    master, job = sys.argv[1], json.loads(open(sys.argv[2]).read())
    import sparkdp
    from sparkdp.data.datasets import fashion_mnist
    from sparkdp.models import build_model

    spark = sparkdp.session(master, conf=job.get("conf"))
    workers = job["fit"].get("workers", 2)
    sc = spark.sparkContext
    # This probe is a barrier stage of its own, submitted right after the session starts: Spark
    # refuses it (SPARK-24819) while the executors are still registering, so wait for their slots.
    from sparkdp.spark.cluster import available_slots

    deadline = time.monotonic() + 60
    while (available_slots(spark) or 0) < workers and time.monotonic() < deadline:
        time.sleep(0.5)
    out = {
        "driver": where(),
        "driver_host": sc.getConf().get("spark.driver.host"),
        "executors": sc.parallelize(range(workers), workers).barrier().mapPartitions(_task_where).collect(),
    }
    data = fashion_mnist(limit=job.get("limit", 2000))
    train, test, columns = (data.x_train, data.y_train), (data.x_test, data.y_test), {}
    if job.get("input") == "dataframe":

        def frame(x, y):
            return spark.createDataFrame(
                [(row.reshape(-1).tolist(), int(label)) for row, label in zip(x, y)],
                "features array<float>, label long",
            )

        import pyarrow as pa
        import pyarrow.parquet as pq

        # evaluation reads Parquet (each worker its fragments); the training rows stream from the DataFrame
        test = str(Path(sys.argv[2]).with_name("eval.parquet"))
        pq.write_table(
            pa.table(
                {
                    "features": pa.array(
                        data.x_test[:1000].reshape(1000, -1).tolist(), pa.list_(pa.float32())
                    ),
                    "label": pa.array(data.y_test[:1000].tolist(), pa.int64()),
                }
            ),
            test,
        )
        train = frame(data.x_train, data.y_train)
        columns = {"features": "features", "label": "label", "feature_shape": tuple(data.x_train.shape[1:])}
    started = time.monotonic()
    try:
        result = sparkdp.fit(
            build_model(job.get("model", "cnn")),
            train,
            eval_data=test,
            spark=spark,
            show_progress=False,
            **columns,
            **job["fit"],
        )
        out["result"] = {
            "samples_per_s": result.samples_per_s,
            "history": result.history,
            "details": {"servers": result.details.get("servers")},
        }
    except Exception as exc:  # noqa: BLE001 - reported to the test, which decides
        out["error"] = {"type": type(exc).__name__, "message": str(exc)}
    out["seconds"] = time.monotonic() - started
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
