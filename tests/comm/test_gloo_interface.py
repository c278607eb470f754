"""Which interface gloo binds to: the one that routes to the rendezvous address, not the one the
hostname resolves to (often 127.0.1.1); a GLOO_SOCKET_IFNAME the user set is kept; and a failed
gloo connection says which interface and address it used and which setting changes it."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from sparkdp.comm import torch_dist
from sparkdp.comm.torch_dist import (
    gloo_interface_note,
    interface_addresses,
    interface_towards,
    set_torch_distributed_env,
    source_address,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux interface addresses")
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(torch_dist, "_CHOSEN_IFNAME", None)


@linux
def test_loopback_is_found_by_its_address():
    assert "127.0.0.1" in interface_addresses()["lo"]
    assert source_address("127.0.0.1") == "127.0.0.1"
    assert interface_towards("127.0.0.1") == ("lo", "127.0.0.1")


@linux
def test_a_non_loopback_rendezvous_picks_the_interface_routing_to_it(monkeypatch):
    # this host's own non-loopback address, if it has one: routing to it names its interface
    own = [
        (name, a)
        for name, addrs in interface_addresses().items()
        for a in addrs
        if name != "lo" and "." in a and not a.startswith("127.")
    ]
    if not own:
        pytest.skip("this machine has no non-loopback IPv4 address")
    name, address = own[0]
    assert interface_towards(address) == (name, address)
    set_torch_distributed_env(address, 1234, 1, 2)
    assert os.environ["GLOO_SOCKET_IFNAME"] == name
    # a rendezvous on loopback afterwards moves sparkdp's own choice back to lo
    set_torch_distributed_env("127.0.0.1", 1234, 1, 2)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"


@linux
def test_the_hostname_resolving_to_loopback_does_not_decide(monkeypatch):
    """The failure seen on real hosts: the hostname resolves to 127.0.1.1, the rendezvous address
    is the executor's real one. The interface must follow the rendezvous address."""
    monkeypatch.setattr(socket, "gethostbyname", lambda _name: "127.0.1.1")
    monkeypatch.setattr(torch_dist, "interface_towards", lambda remote: ("eth7", "198.18.0.12"))
    set_torch_distributed_env("198.18.0.13", 4000, 1, 2)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    assert "GLOO_SOCKET_IFNAME=eth7" in gloo_interface_note()
    assert "chosen by sparkdp" in gloo_interface_note()


def test_a_users_own_setting_is_kept(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    set_torch_distributed_env("127.0.0.1", 1234, 0, 2)
    assert os.environ["GLOO_SOCKET_IFNAME"] == "ib0"
    note = gloo_interface_note()
    assert "GLOO_SOCKET_IFNAME=ib0" in note and "set in the environment" in note


def test_no_route_leaves_gloo_to_the_hostname_and_says_so(monkeypatch):
    monkeypatch.setattr(torch_dist, "interface_towards", lambda remote: None)
    set_torch_distributed_env("198.18.0.99", 1234, 1, 2)
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    note = gloo_interface_note()
    assert socket.gethostname() in note and "spark.executorEnv.GLOO_SOCKET_IFNAME" in note


def test_an_unresolvable_rendezvous_host_has_no_source_address():
    assert source_address("no-such-host.invalid") is None


def test_an_unreachable_rendezvous_store_is_named_within_seconds(monkeypatch):
    """Nothing listens on the port of a store the launcher said was listening: the error comes
    after the short connect grace (10 s; 1 s here), not the 60 s process-group timeout, and names
    the address, the port and what to check."""
    import time

    from sparkdp.comm.torch_dist import TorchCollective
    from sparkdp.errors import RendezvousTimeout

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(torch_dist, "STORE_CONNECT_GRACE_S", 1.0)
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout) as info:
        TorchCollective().setup(
            master_addr="127.0.0.1",
            master_port=port,
            rank=1,
            world_size=2,
            timeout_s=60,
            store_listening=True,
        )
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"rendezvous store at 127.0.0.1:{port}" in message and "ConnectionRefusedError" in message, message
    assert "firewall" in message and "SPARK_LOCAL_IP" in message, message
