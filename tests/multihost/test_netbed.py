"""The test bed itself: every host looks like a machine of its own (hostname, /etc/hosts, /dev/shm,
network namespace, address), its link is shaped to the rate asked for, and nothing it created is
left after teardown, when the body fails or when its owner was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from . import netbed

pytestmark = [pytest.mark.multihost]

_WHERE = (
    "import json, os, socket; print(json.dumps({'hostname': socket.gethostname(), "
    "'netns': os.stat('/proc/self/ns/net').st_ino, 'shm': sorted(os.listdir('/dev/shm')), "
    "'peer': socket.gethostbyname('b'), 'self': socket.gethostbyname(socket.gethostname())}))"
)


@pytest.mark.timeout(60)
def test_each_host_has_its_own_name_address_namespace_and_shm():
    with netbed.NetBed(["a", "b"], rate="100mbit") as bed:
        # a file written to a's /dev/shm must not be visible on b nor on this machine
        marker = f"{bed.prefix}-marker"
        wrote = bed.run("a", ["sh", "-c", f"touch /dev/shm/{marker} && ls /dev/shm"], timeout=30)
        assert wrote.returncode == 0 and marker in wrote.stdout, wrote.stderr
        seen = {
            h: json.loads(bed.run(h, [sys.executable, "-c", _WHERE], timeout=30).stdout) for h in ("a", "b")
        }
    assert seen["a"]["hostname"] == "a" and seen["b"]["hostname"] == "b"
    assert seen["a"]["netns"] != seen["b"]["netns"] != os.stat("/proc/self/ns/net").st_ino
    assert seen["a"]["peer"] == seen["b"]["peer"] == "198.18.0.11"
    assert seen["a"]["self"] == "198.18.0.10"
    assert (
        marker not in seen["b"]["shm"] and marker not in seen["a"]["shm"]
    )  # a's tmpfs went with its process
    assert not os.path.exists(f"/dev/shm/{marker}")
    assert not bed.leftovers()


@pytest.mark.timeout(60)
def test_hostname_loopback_mode_resolves_each_host_to_127_0_1_1_on_itself():
    with netbed.NetBed(["a", "b"], rate=None, hostname_loopback=True) as bed:
        seen = json.loads(bed.run("a", [sys.executable, "-c", _WHERE], timeout=30).stdout)
    assert seen["self"] == "127.0.1.1" and seen["peer"] == "198.18.0.11"


_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.bind((sys.argv[1], 5001)); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = 0; t = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    t = t or time.monotonic(); n += len(b)
print(n * 8 / (time.monotonic() - t) / 1e6, flush=True)
"""
_SENDER = """
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 5001), timeout=5); break
    except OSError:
        time.sleep(0.1)
block = b"x" * (1 << 16)
end = time.monotonic() + 3
while time.monotonic() < end: c.sendall(block)
c.close()
"""


def _throughput(bed: netbed.NetBed, sender: str, receiver: str) -> float:
    out = bed.directory / f"recv-{receiver}.log"
    proc = bed.popen(receiver, [sys.executable, "-c", _RECEIVER, bed.address(receiver)], log=out)
    sent = bed.run(sender, [sys.executable, "-c", _SENDER, bed.address(receiver)], timeout=30)
    assert sent.returncode == 0, sent.stderr
    proc.wait(30)
    return float(out.read_text().split()[-1])


@pytest.mark.timeout(90)
def test_links_are_shaped_per_host():
    """20 Mbit/s everywhere but c at 5: a->b runs at ~20, a->c at ~5 (c's download), c->a at ~5
    (c's upload)."""
    rates = {"c": "5mbit"}
    with netbed.NetBed(["a", "b", "c"], rate="20mbit", rates=rates) as bed:
        ab = _throughput(bed, "a", "b")
        ac = _throughput(bed, "a", "c")
        ca = _throughput(bed, "c", "a")
        stats = bed.qdisc_stats("c")
    assert 15 < ab < 22, ab
    assert 3.5 < ac < 5.5 and 3.5 < ca < 5.5, (ac, ca)
    assert stats["sent"] > 1_000_000 and stats["received"] > 1_000_000, stats
    assert rates == {"c": "5mbit"}  # the bed records its rates in a dict of its own (one bed after another)


@pytest.mark.timeout(60)
def test_teardown_runs_when_the_body_fails_and_kills_every_process():
    bed = netbed.NetBed(["a"], rate=None)
    with pytest.raises(RuntimeError, match="boom"), bed:
        proc = bed.popen("a", ["sleep", "600"])
        # a grandchild in its own session escapes the process group; only the namespace finds it
        bed.run("a", ["sh", "-c", "setsid sleep 601 >/dev/null 2>&1 < /dev/null &"], timeout=10)
        pids = subprocess.run(
            ["ip", "netns", "pids", bed.netns("a")], capture_output=True, text=True
        ).stdout.split()
        assert len(pids) >= 2, pids
        raise RuntimeError("boom")
    assert proc.poll() is not None
    assert not bed.leftovers()
    assert not any(
        os.path.exists(f"/proc/{pid}") and "sleep" in open(f"/proc/{pid}/cmdline").read() for pid in pids
    )
    assert not bed.directory.exists()


@pytest.mark.timeout(60)
def test_a_killed_runs_leftovers_are_removed_as_stale():
    """A test bed whose owner died by SIGKILL (no finally, no atexit) is found by its name."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; sys.path.insert(0, sys.argv[1]);"
                "from tests.multihost.netbed import NetBed;"
                "bed = NetBed(['a'], rate='10mbit').up(); bed.popen('a', ['sleep', '600']);"
                "print(bed.prefix, flush=True); time.sleep(600)"
            ),
            str(netbed.Path(__file__).parents[2]),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        prefix = child.stdout.readline().strip()
        assert prefix.startswith(f"{netbed.PREFIX_ROOT}-{child.pid}-"), prefix
        assert any(n.startswith(prefix) for n in netbed._netns_names())
    finally:
        os.killpg(child.pid, 9)
        child.wait(10)
    time.sleep(0.2)
    removed = netbed.remove_stale()
    assert sorted(removed) == sorted([f"{prefix}-a", f"{prefix}-bridge"])
    assert not any(n.startswith(prefix) for n in netbed._netns_names())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_tear_the_bed_down(sig):
    """A script holding a bed (with a process on a host) is interrupted: its namespaces, its
    processes and its directory are gone when it exits, with no help from remove_stale."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                # Ctrl-C's KeyboardInterrupt even when this test runs in a background job, whose children
                # start with SIGINT ignored (and Python then leaves it so)
                "import signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler);"
                "sys.path.insert(0, sys.argv[1]);"
                "from tests.multihost import netbed; netbed.install_signal_teardown();"
                "bed = netbed.NetBed(['a', 'b'], rate='10mbit').up(); p = bed.popen('a', ['sleep', '600']);"
                "print(bed.prefix, bed.directory, p.pid, flush=True); time.sleep(600)"
            ),
            str(netbed.Path(__file__).parents[2]),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        prefix, directory, pid = child.stdout.readline().split()
        assert any(n.startswith(prefix) for n in netbed._netns_names())
        child.send_signal(sig)
        child.wait(30)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(10)
    assert not any(n.startswith(prefix) for n in netbed._netns_names())
    assert not os.path.exists(directory)
    assert not os.path.exists(f"/proc/{pid}") or "sleep" not in open(f"/proc/{pid}/cmdline").read()


def test_rates_are_parsed_as_tc_writes_them():
    assert netbed.parse_rate("100mbit") == 100_000_000
    assert netbed.parse_rate("1gbit") == 1_000_000_000
    assert netbed.auto_burst("1gbit") == "500000b" and netbed.auto_burst("1mbit") == "32768b"
    with pytest.raises(ValueError, match="tc"):
        netbed.parse_rate("100MB/s")
