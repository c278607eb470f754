"""``sparkdp launch``: real single-machine script shapes run through Spark on local[2], each
checked against the same script run as one plain process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Cli
from .test_cli import _explain, sparkdp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _alone(script: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
        env={**os.environ, **(env or {})},
    )


def _accuracy(path: Path) -> dict:
    return json.loads(path.read_text())


def _launch(script: Path, *args: str) -> subprocess.CompletedProcess:
    return sparkdp("launch", "--workers", "2", "--master", "local[2]", str(script), "--", *args, timeout=240)


def _launch_cli(script: Path, *args: str, options: tuple[str, ...] = ()) -> Cli:
    """``sparkdp launch`` on 2 workers of local[2] (``options``: more of launch's own flags)."""
    argv = ["launch", "--workers", "2", "--master", "local[2]", *options, str(script), "--", *args]
    return Cli(argv, master="local[2]")


@pytest.mark.cli(
    build=lambda tmp: _launch_cli(
        SCRIPTS / "argparse_main.py", "--epochs", "2", "--out", str(tmp / "spark.json")
    )
)
def test_an_argparse_main_with_the_one_line_matches_one_process(cli, tmp_path):
    script = SCRIPTS / "argparse_main.py"
    alone = _alone(script, "--epochs", "2", "--out", str(tmp_path / "alone.json"))
    assert alone.returncode == 0, _explain(alone)
    (spark,) = cli.procs
    assert spark.returncode == 0, _explain(spark)
    single, launched = _accuracy(tmp_path / "alone.json"), _accuracy(cli.tmp / "spark.json")
    assert abs(launched["accuracy"] - single["accuracy"]) < 0.05, (launched, single)
    assert launched["accuracy"] > 0.8
    assert launched["keys"] == single["keys"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    # every rank's progress lines reach the driver's own stdout through the monitoring link,
    # prefixed; len(loader.dataset) is the full dataset, as in the single-machine script
    assert "[rank 0] Train Epoch: 1 [0/2400]" in spark.stdout and "[rank 1] Train Epoch: 2" in spark.stdout
    assert "trained its own independent copy" not in spark.stderr


# (make test-all) the torchrun environment path also runs in make test through
# tests/cli/test_launch_hf.py::test_an_accelerate_script_runs_unmodified, which checks every
# torchrun variable on both ranks and the loss gathered over them
@pytest.mark.slow
def test_a_torchrun_script_runs_unchanged(tmp_path):
    script = SCRIPTS / "torchrun_ddp.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    alone = _alone(script, "--epochs", "2", "--out", str(tmp_path / "alone.json"), env=env)
    assert alone.returncode == 0, _explain(alone)
    spark = _launch(script, "--epochs", "2", "--out", str(tmp_path / "spark.json"))
    assert spark.returncode == 0, _explain(spark)
    launched = _accuracy(tmp_path / "spark.json")
    assert launched["world"] == 2
    assert abs(launched["accuracy"] - _accuracy(tmp_path / "alone.json")["accuracy"]) < 0.05
    assert "[rank 1] rank 1 finished epoch 2 of 2" in spark.stdout + spark.stderr


@pytest.mark.slow  # (make test-all) the cluster test above imports a sibling module too
def test_a_script_importing_its_sibling_module(tmp_path):
    script = SCRIPTS / "sibling" / "train.py"
    alone = _alone(script, "2", str(tmp_path / "alone.json"))
    assert alone.returncode == 0, _explain(alone)
    spark = _launch(script, "2", str(tmp_path / "spark.json"))
    assert spark.returncode == 0, _explain(spark)
    assert (
        abs(_accuracy(tmp_path / "spark.json")["accuracy"] - _accuracy(tmp_path / "alone.json")["accuracy"])
        < 0.05
    )


@pytest.mark.cli(build=lambda tmp: _launch_cli(SCRIPTS / "exits.py", options=("--max-restarts", "0")))
def test_a_non_zero_exit_names_the_rank(cli):
    (failed,) = cli.procs
    assert failed.returncode == 2
    assert "worker 1 failed: ScriptFailed: exits.py exited with status 3 on worker 1" in failed.stderr, (
        _explain(failed)
    )


def test_a_missing_script_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys):
    import sparkdp as sparkdp_package
    from sparkdp.cli.main import main

    def no_spark(*args, **kwargs):
        raise AssertionError("sparkdp launch started Spark before refusing a missing script")

    monkeypatch.setattr(sparkdp_package, "session", no_spark)
    assert main(["launch", str(tmp_path / "nope.py")]) == 2
    assert f"no training script at {str(tmp_path / 'nope.py')!r}" in capsys.readouterr().err


@pytest.mark.slow  # (make test-all) a message's wording
def test_a_module_the_executors_lack_is_named_with_their_interpreter():
    failed = _launch(SCRIPTS / "missing_module.py")
    assert failed.returncode == 2
    assert "No module named 'sparkdp_no_such_module'" in failed.stderr, _explain(failed)
    assert f"the executor's interpreter is {sys.executable}" in failed.stderr


@pytest.mark.slow  # (make test-all) one process per worker; the spawning script's test stays in make test
def test_a_hogwild_script_trains_asynchronously_through_the_parameter_server(tmp_path):
    """The processes of a Hogwild! script become Spark workers and its shared-memory model the
    parameter server (``--strategy hogwild``): the same file, one process per worker."""
    script = SCRIPTS / "hogwild.py"
    alone = _alone(
        script, "--epochs", "3", "--out", str(tmp_path / "alone.json")
    )  # 2 processes, shared memory
    assert alone.returncode == 0, _explain(alone)
    spark = sparkdp(
        "launch",
        "--workers",
        "2",
        "--master",
        "local[2]",
        "--strategy",
        "hogwild",
        "--strategy-option",
        'rule_options={"lr": 0.05}',
        str(script),
        "--",
        "--num-processes",
        "1",
        "--epochs",
        "3",
        "--out",
        str(tmp_path / "spark.json"),
        timeout=240,
    )
    assert spark.returncode == 0, _explain(spark)
    launched, single = _accuracy(tmp_path / "spark.json"), _accuracy(tmp_path / "alone.json")
    # rank 0 tests its copy of the centre when it finishes, which may be before worker 1 has
    # pushed everything (asynchronous): a looser bound than the synchronous scripts'
    assert launched["accuracy"] > 0.85 and abs(launched["accuracy"] - single["accuracy"]) < 0.07, (
        launched,
        single,
    )
    assert "[rank 0] Test accuracy" in spark.stdout and "[rank 1] Test accuracy" in spark.stdout
    steps = [
        line.split()
        for line in (spark.stdout + spark.stderr).splitlines()
        if line.lstrip().startswith(("0 ", "1 "))
    ]
    assert [row[2] for row in steps] == ["114", "114"], spark.stderr  # 3 epochs x 38 batches, counted live
    # a torchrun-style script cannot run asynchronously: its workers share no process group
    ddp = sparkdp(
        "launch",
        "--workers",
        "2",
        "--master",
        "local[2]",
        "--strategy",
        "asgd",
        str(SCRIPTS / "torchrun_ddp.py"),
        "--",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "ddp.json"),
        timeout=240,
    )
    assert ddp.returncode != 0 and "is asynchronous: its workers share no process group" in ddp.stderr, (
        _explain(ddp)
    )


HOGWILD_EPOCHS = 4


def _hogwild_args(method: str, processes: int) -> list[str]:
    return ["--num-processes", str(processes), "--start-method", method, "--epochs", str(HOGWILD_EPOCHS)]


def _hogwild_cli(tmp: Path, method: str, processes: int) -> Cli:
    script = SCRIPTS / "hogwild_spawn.py"
    options = ("--strategy", "hogwild", "--strategy-option", 'rule_options={"lr": 0.1}')
    launch = _launch_cli(
        script, *_hogwild_args(method, processes), "--out", str(tmp / "spark.json"), options=options
    )
    return Cli(["-v", *launch.argv], master=launch.master, timeout=300)


def _hogwild_processes(cli, tmp_path, method: str, processes: int) -> None:
    """The canonical spawning Hogwild! script with the one line: every process each of the 2
    Spark workers starts pushes to the server (2 workers x processes x 38 batches x epochs: the
    server's applied pushes), and the accuracy is the script's alone within 0.05."""
    epochs = HOGWILD_EPOCHS
    alone = _alone(
        SCRIPTS / "hogwild_spawn.py", *_hogwild_args(method, processes), "--out", str(tmp_path / "alone.json")
    )
    assert alone.returncode == 0, _explain(alone)
    (spark,) = cli.procs
    assert spark.returncode == 0, _explain(spark)
    assert f"{processes} of the {processes} processes worker 0 started joined the job" in spark.stderr, (
        _explain(spark)
    )
    server = next(line for line in spark.stderr.splitlines() if "parameter server: {" in line)
    assert f"'pushes_applied': {2 * processes * 38 * epochs}," in server and "'rejected': 0" in server, server
    launched, single = _accuracy(cli.tmp / "spark.json"), _accuracy(tmp_path / "alone.json")
    assert abs(launched["accuracy"] - single["accuracy"]) < 0.05 and launched["accuracy"] > 0.85, (
        launched,
        single,
    )


@pytest.mark.cli(build=lambda tmp: _hogwild_cli(tmp, "spawn", 2))
def test_processes_a_hogwild_script_starts_join_the_parameter_server(cli, tmp_path):
    _hogwild_processes(cli, tmp_path, "spawn", 2)


@pytest.mark.slow  # (make test-all) the other start method and process counts
@pytest.mark.cli(build=_hogwild_cli)
@pytest.mark.parametrize(("method", "processes"), [("fork", 1), ("spawn", 1), ("fork", 2)])
def test_processes_a_hogwild_script_starts_join_the_parameter_server_more_shapes(
    cli, tmp_path, method, processes
):
    _hogwild_processes(cli, tmp_path, method, processes)


@pytest.mark.slow  # (make test-all) a message's wording
def test_processes_a_synchronous_job_starts_are_named_as_training_alone(tmp_path):
    script = SCRIPTS / "hogwild_spawn.py"
    spark = sparkdp(
        "launch",
        "--workers",
        "2",
        "--master",
        "local[2]",
        str(script),
        "--",
        "--num-processes",
        "1",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "spark.json"),
        timeout=240,
    )
    assert spark.returncode == 0, _explain(spark)
    assert (
        "hogwild_spawn.py started 1 process(es) on worker 0 and none joined the job: in a synchronous job "
        "(allreduce, average) processes a worker starts cannot join"
    ) in spark.stderr, _explain(spark)
    assert "trained its own independent copy" not in spark.stderr


@pytest.mark.spark
@pytest.mark.timeout(400)
@pytest.mark.slow  # (make test-all) a standalone cluster; make test-multihost ships a script to other hosts too
def test_on_a_cluster_master_the_scripts_directory_is_shipped_to_the_executors(tmp_path):
    """On a real standalone master the workers run a copy of the script's directory that Spark's
    addFile shipped (so executors need not share the driver's filesystem), sibling modules
    included; the result matches the script run alone."""
    from tests.helpers.standalone import StandaloneCluster

    job = tmp_path / "job"
    shutil.copytree(SCRIPTS / "sibling", job)
    (job / "where.py").write_text(
        "import os, sys\nprint('ran from', os.path.abspath(sys.argv[0]))\n"
        "exec(open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "
        "'train.py')).read())\n"
    )
    shutil.copy(SCRIPTS / "common_data.py", job)
    alone = _alone(job / "train.py", "2", str(tmp_path / "alone.json"))
    assert alone.returncode == 0, _explain(alone)
    (tmp_path / "cluster").mkdir()
    cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1).start()
    try:
        spark = sparkdp(
            "launch",
            "--workers",
            "2",
            "--master",
            cluster.master_url,
            str(job / "where.py"),
            "--",
            "2",
            str(tmp_path / "spark.json"),
            env=cluster.env(),
            timeout=300,
        )
    finally:
        cluster.stop()
    assert spark.returncode == 0, _explain(spark)
    ran_from = [line.split("ran from ", 1)[1] for line in spark.stdout.splitlines() if "ran from " in line]
    # each executor's own unpacked copy, in its Spark work directory (not the driver's file)
    assert len(ran_from) == 2 and all(
        str(tmp_path / "cluster" / "work") in p and "/job-" in p and p.endswith(".zip/where.py")
        for p in ran_from
    ), spark.stdout
    assert (
        abs(_accuracy(tmp_path / "spark.json")["accuracy"] - _accuracy(tmp_path / "alone.json")["accuracy"])
        < 0.05
    )
