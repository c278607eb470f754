"""Hygiene fixtures for every test (design rule 8, docs/architecture.md) and the shared Spark session."""

from __future__ import annotations

import os
import threading

import pytest

from sparkdp.comm.torchrun_env import TORCHRUN_VARIABLES

# Variables that torch.distributed / Spark legitimately set in-process.
_ENV_ALLOWED = {
    *TORCHRUN_VARIABLES,
    "GLOO_SOCKET_IFNAME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_LOCAL_IP",
    "PYSPARK_GATEWAY_PORT",
    "PYSPARK_GATEWAY_SECRET",
    "SPARK_HOME",
    "PYTHONHASHSEED",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "PYSPARK_PIN_THREAD",
    "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK",
    "PYTEST_CURRENT_TEST",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
}


@pytest.fixture(autouse=True)
def restore_env_variables():
    before = dict(os.environ)
    yield
    leaked = {k for k in os.environ if k not in before} - _ENV_ALLOWED
    changed = {k for k in before if k in os.environ and os.environ[k] != before[k]} - _ENV_ALLOWED
    os.environ.clear()
    os.environ.update(before)
    assert not leaked and not changed, f"test leaked environment variables: {sorted(leaked | changed)}"


@pytest.fixture(autouse=True)
def teardown_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# sparkdp.session()'s warm-up thread runs one no-op Spark job and ends with it (or with the session).
_SELF_ENDING_THREADS = {"sparkdp-warm-up"}


@pytest.fixture(autouse=True)
def no_zombie_threads():
    """A parameter-server, transport or monitor thread (named sparkdp*) left alive fails the test."""
    before = set(threading.enumerate())
    yield
    leftover = [
        t
        for t in threading.enumerate()
        if t not in before
        and t.is_alive()
        and t.name.lower().startswith("sparkdp")
        and t.name not in _SELF_ENDING_THREADS
    ]
    for t in leftover:
        t.join(timeout=5)
    alive = [t.name for t in leftover if t.is_alive()]
    assert not alive, f"threads left running: {alive}"


def pytest_collection_modifyitems(items):
    """A test that takes the ``spark`` fixture needs a JVM: mark it, so ``make test-fast`` (which
    deselects ``spark``) cannot start one through a forgotten marker."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    """One local[2,4] SparkSession (2 slots, 4 task attempts) for all Spark tests, always stopped."""
    import sparkdp

    session = sparkdp.session("local[2,4]", app_name="sparkdp-tests")  # as the embedded default
    try:
        yield session
    finally:
        session.stop()
