"""Fixtures of the multi-host tests: a test bed of network namespaces (``netbed.py``) with a Spark
standalone cluster on it. Every test here is marked ``multihost`` (run them with ``make
test-multihost``); without root they are skipped, with the reason."""

from __future__ import annotations

import pytest

from . import netbed

REASON = netbed.unavailable()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/multihost/" in item.nodeid.replace("\\", "/"):
            if REASON:
                item.add_marker(pytest.mark.skip(reason=REASON))


def pytest_configure(config):
    if not REASON:
        netbed.install_signal_teardown()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Driver, Master and two Workers, each its own host on a 1 Gbit/s link; every host's name
    resolves to 127.0.1.1 on that host (the default /etc/hosts of many distributions), the case
    in which same-host assumptions and hostname-based address choices break."""
    netbed.remove_stale()
    bed = netbed.NetBed(netbed.cluster_hosts(2), rate="1gbit", hostname_loopback=True)
    try:
        bed.up()
        yield netbed.SparkOnNetBed(bed, ["worker-0", "worker-1"]).start()
    finally:
        bed.down()
    assert not bed.leftovers(), f"namespaces left after teardown: {bed.leftovers()}"
