"""A Spark Connect server (the installed pyspark's ``sbin/start-connect-server.sh``) in front of
the test bed's standalone cluster, and a client on a host of its own that the executors cannot
connect to, as a laptop or a notebook behind NAT: sparkdp says so within seconds and trains
anyway, synchronously and asynchronously; ``sparkdp.run`` with a parameter server in the client
fails within seconds, saying what to use instead."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from . import netbed

pytestmark = [pytest.mark.multihost]

CONNECT_PORT = 15002


def _start_connect_server(cluster: netbed.SparkOnNetBed) -> str:
    bed = cluster.bed
    driver = bed.address("driver")
    bed.popen(
        "driver",
        [
            str(netbed.spark_home() / "sbin" / "start-connect-server.sh"),
            "--wait",
            "--master",
            cluster.master_url,
            "--conf",
            f"spark.driver.host={driver}",
            "--conf",
            f"spark.connect.grpc.binding.address={driver}",
            "--conf",
            f"spark.connect.grpc.binding.port={CONNECT_PORT}",
        ],
        env=cluster.env(SPARK_PID_DIR=str(bed.directory)),
        log=cluster.log("connect-server"),
    )
    # the client host polls the server's port until it listens
    wait = (
        "import socket, sys, time\n"
        "deadline = time.monotonic() + 150\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        f"        socket.create_connection(({driver!r}, {CONNECT_PORT}), 2).close(); sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(1)\n"
        "sys.exit(1)\n"
    )
    ready = bed.run("client", [sys.executable, "-c", wait], timeout=180)
    log = cluster.log("connect-server")
    assert ready.returncode == 0, log.read_text(errors="replace")[-3000:] if log.exists() else "no server log"
    return f"sc://{driver}:{CONNECT_PORT}"


@pytest.mark.timeout(900)
def test_a_connect_client_the_executors_cannot_reach_trains_sync_and_async():
    netbed.remove_stale()
    with netbed.NetBed([*netbed.cluster_hosts(2), "client"], rate="1gbit") as bed:
        cluster = netbed.SparkOnNetBed(bed, ["worker-0", "worker-1"]).start()
        bed.unreachable_from(["worker-0", "worker-1"], "client")
        client = bed.address("client")
        # the executors' hosts provably cannot open a connection to the client
        tried = bed.run(
            "worker-0",
            [sys.executable, "-c", f"import socket; socket.create_connection(({client!r}, 9), 5)"],
            timeout=30,
        )
        assert tried.returncode != 0 and "No route to host" in tried.stderr, tried.stderr[-2000:]
        remote = _start_connect_server(cluster)
        job = bed.directory / "connect-job.json"
        job.write_text(
            json.dumps(
                {
                    "limit": 2000,
                    "fits": [
                        {
                            "strategy": "allreduce",
                            "workers": 2,
                            "epochs": 1,
                            "optimizer_options": {"lr": 0.05},
                        },
                        {"strategy": "asgd", "workers": 1, "epochs": 1, "optimizer_options": {"lr": 0.05}},
                    ],
                    "run_strategies": ["allreduce", "asgd"],
                }
            )
        )
        proc = bed.run(
            "client",
            [sys.executable, str(Path(__file__).with_name("connect_job.py")), remote, str(job)],
            env=cluster.env(),
            timeout=700,
            cwd=bed.directory,
        )
    assert not bed.leftovers()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"client failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert out["connect"].startswith("pyspark.sql.connect") and out["client"] == "client"
    assert out["executors"] == ["worker-0", "worker-1"], out["executors"]
    sync, async_ = out["runs"]
    for run in (sync, async_):
        assert "error" not in run, run
        assert run["history"][-1]["test_accuracy"] > 0.25, run["history"]  # 10 classes: chance is 0.1
        # one line says live monitoring is off and why, naming the client's address
        [monitoring] = [w for w in run["warnings"] if "live monitoring is off" in w]
        assert f"cannot reach this process at {client}:" in monitoring and "No route to host" in monitoring, (
            monitoring
        )
    assert sync["servers"] == []
    # the asynchronous job's parameter server moved to the executors, with one line saying so
    [moved] = [w for w in async_["warnings"] if "parameter server runs as a Spark task" in w]
    assert "(servers=1)" in moved and client in moved, moved
    assert len(async_["servers"]) == 1 and async_["servers"][0] in ("worker-0", "worker-1"), async_["servers"]
    # sparkdp.run: synchronous needs nothing from the client; asynchronous keeps its server in the
    # client (its centre is the first worker's model), so it fails within seconds saying what to use
    sync_call, async_call = out["calls"]
    assert sync_call.get("result") == 1, sync_call
    message = async_call["error"]["message"]
    assert "cannot reach the parameter server in this Spark Connect client" in message, async_call
    assert "synchronous strategy" in message and "sparkdp.fit" in message and async_call["seconds"] < 30, (
        async_call
    )
