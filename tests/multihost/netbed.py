"""Several "machines" on one Linux box: network namespaces joined by a bridge, with a rate-limited
link per host, and a Spark standalone cluster spread over them.

Layout (every name starts with a per-run prefix, ``sdpnb-<pid>-<hex>``, so teardown finds it):

- ``<prefix>-bridge``: a namespace holding the bridge ``br0`` and one port ``p<i>`` per host;
- ``<prefix>-<host>``: one namespace per host, with ``lo`` and ``eth0`` (a veth whose peer is
  the bridge port), address ``198.18.0.<10+i>/24`` (the benchmarking range, RFC 2544).

Both ends of every veth are created directly inside their namespaces, so nothing is ever added to
the root namespace. Each host's upload is limited by a ``tbf`` qdisc on its ``eth0`` and its
download by one on its bridge port (rate, burst and latency are parameters; a host may have its
own rate, e.g. one slow host). ``tbf``'s latency bounds its queue; it adds no delay.

What runs on a host runs as ``ip netns exec NS unshare --uts --mount ...``: its own hostname (the
host's name), an ``/etc/hosts`` naming every host by its address (bind-mounted), and its own
``/dev/shm`` (a tmpfs), so same-host shortcuts (shared-memory all-reduce, shared data files)
cannot bypass the links. With ``hostname_loopback=True`` each host's own name resolves to
``127.0.1.1`` instead, as in many distributions' default ``/etc/hosts``.

Teardown (:meth:`NetBed.down`) kills the process groups it started (by PID), then every process
still inside one of its namespaces (``ip netns pids``, by PID), then deletes the namespaces
(which removes the veths, the bridge and the qdiscs with them) and the run's temporary directory.
It runs from ``finally``, from ``atexit`` and on SIGTERM/SIGINT (:func:`install_signal_teardown`);
:func:`remove_stale` removes what a run killed with SIGKILL left behind (its owner PID is gone).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX_ROOT = "sdpnb"
NETWORK = ipaddress.ip_network("198.18.0.0/24")
FIRST_HOST = 10  # host i gets 198.18.0.<10 + i>
assert NETWORK.subnet_of(ipaddress.ip_network("198.18.0.0/15"))

# hostname, hosts file, /dev/shm size, then the command (run in the new UTS + mount namespaces)
_ENTER = """set -e
hostname "$1"
mount --bind "$2" /etc/hosts
mount -t tmpfs -o "size=$3,mode=1777" "sdpnb-shm" /dev/shm
shift 3
exec "$@"
"""

_LIVE: dict[str, NetBed] = {}


def unavailable() -> str | None:
    """Why a test bed cannot be built here (None when it can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces, veths, tc, mounts)"
    for tool in ("ip", "tc", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            return f"the multi-host test bed needs `{tool}` on PATH"
    return None


def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _netns_names() -> list[str]:
    out = _sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process inside network namespace ``ns`` (by PID), then delete it."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    _sh("ip", "netns", "del", ns, check=False)


def remove_stale(root: str = PREFIX_ROOT) -> list[str]:
    """Delete namespaces (and their processes) left by test-bed runs whose process is gone."""
    removed = []
    for ns in _netns_names():
        match = re.fullmatch(rf"{root}-(\d+)-[0-9a-f]+-.+", ns)
        if not match:
            continue
        owner = int(match.group(1))
        try:
            os.kill(owner, 0)
            continue  # its owner still runs: not stale
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_namespace(ns)
        removed.append(ns)
    for leftover in Path(tempfile.gettempdir()).glob(f"{root}-*"):
        match = re.match(rf"{root}-(\d+)-", leftover.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            shutil.rmtree(leftover, ignore_errors=True)
    return removed


def auto_burst(rate: str) -> str:
    """A tbf bucket big enough for ``rate`` at a 250 Hz timer (rate/250), at least 32 KiB."""
    bits = parse_rate(rate)
    return f"{max(32 * 1024, bits // 8 // 250)}b"


def parse_rate(rate: str) -> int:
    """``"100mbit"`` -> 100_000_000 (bits/s); tc's bit units (kbit, mbit, gbit, bit)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(k|m|g)?bit", rate.strip().lower())
    if not match:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 100mbit or 1gbit")
    scale = {None: 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}[match.group(2)]
    return int(float(match.group(1)) * scale)


@dataclass
class NetBed:
    """Hosts on a shaped bridge; use as a context manager (or :meth:`up` / :meth:`down`).

    Args:
        hosts: host names (also their hostnames), e.g. ``["driver", "master", "worker-0"]``.
        rate: every host's link rate in each direction (tc units, ``"1gbit"``, ``"100mbit"``);
            ``None`` leaves the links unshaped.
        rates: per-host rates overriding ``rate`` (a slow host).
        burst: the tbf bucket (default: :func:`auto_burst` of the rate).
        latency: the longest a packet may wait in a tbf queue.
        shm_size: each host's ``/dev/shm`` tmpfs size.
        hostname_loopback: each host's own name resolves to 127.0.1.1 on that host.
    """

    hosts: list[str]
    rate: str | None = "1gbit"
    rates: dict[str, str] = field(default_factory=dict)
    burst: str | None = None
    latency: str = "50ms"
    shm_size: str = "2g"
    hostname_loopback: bool = False
    prefix: str = ""
    directory: Path = field(default=Path(), init=False)
    procs: list[subprocess.Popen] = field(default_factory=list, init=False)
    _up: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if len(self.hosts) > 200 or len(set(self.hosts)) != len(self.hosts):
            raise ValueError("host names must be unique, at most 200")
        for name in self.hosts:
            if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", name):
                raise ValueError(f"host name {name!r}: lower-case letters, digits and '-'")
        self.rates = dict(self.rates)  # set_rate records here: never in the caller's dict
        unknown = set(self.rates) - set(self.hosts)
        if unknown:
            raise ValueError(f"rates for unknown hosts {sorted(unknown)}")
        self.prefix = self.prefix or f"{PREFIX_ROOT}-{os.getpid()}-{secrets.token_hex(3)}"

    # ------------------------------------------------------------------ names and addresses
    def netns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    @property
    def bridge_netns(self) -> str:
        return f"{self.prefix}-bridge"

    def address(self, host: str) -> str:
        return str(NETWORK.network_address + FIRST_HOST + self.hosts.index(host))

    def port(self, host: str) -> str:
        """The bridge port (in the bridge namespace) that leads to ``host``."""
        return f"p{self.hosts.index(host)}"

    def host_rate(self, host: str) -> str | None:
        return self.rates.get(host, self.rate)

    def hosts_file(self, host: str) -> Path:
        return self.directory / "etc" / f"hosts.{host}"

    # ------------------------------------------------------------------ lifecycle
    def up(self) -> NetBed:
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        _LIVE[self.prefix] = self
        self._up = True
        self.directory = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        br = self.bridge_netns
        _sh("ip", "netns", "add", br)
        _sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", br, "link", "set", "br0", "up")
        (self.directory / "etc").mkdir()
        for host in self.hosts:
            ns, port = self.netns(host), self.port(host)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", br)
            _sh("ip", "-n", br, "link", "set", port, "master", "br0")
            _sh("ip", "-n", br, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(host)}/{NETWORK.prefixlen}", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.set_rate(host, self.host_rate(host))
            self.hosts_file(host).write_text(self._hosts_text(host))

    def _hosts_text(self, me: str) -> str:
        lines = ["127.0.0.1 localhost"]
        if self.hostname_loopback:
            lines.append(f"127.0.1.1 {me}")
        lines += [f"{self.address(h)} {h}" for h in self.hosts if not (self.hostname_loopback and h == me)]
        return "\n".join(lines) + "\n"

    def set_rate(self, host: str, rate: str | None) -> None:
        """(Re)shape ``host``'s link both ways: tbf on its eth0 (upload) and its bridge port (download)."""
        for ns, dev in ((self.netns(host), "eth0"), (self.bridge_netns, self.port(host))):
            _sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
            if rate is not None:
                _sh(
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    self.burst or auto_burst(rate),
                    "latency",
                    self.latency,
                )
        if rate is None:
            self.rates.pop(host, None)
        else:
            self.rates[host] = rate

    def unreachable_from(self, hosts: list[str], target: str) -> None:
        """Connections from ``hosts`` to ``target`` fail at once ("No route to host"), while
        ``target`` still reaches them and gets their replies: a client behind NAT or a firewall."""
        for host in hosts:
            _sh("ip", "-n", self.netns(host), "route", "add", "unreachable", f"{self.address(target)}/32")

    def link_down(self, host: str) -> None:
        """Cut ``host`` off the bridge (its port goes down), as a pulled cable."""
        _sh("ip", "-n", self.bridge_netns, "link", "set", self.port(host), "down")

    def qdisc_stats(self, host: str) -> dict[str, int]:
        """Bytes sent by ``host`` (its eth0's tbf) and to it (its bridge port's tbf)."""
        out = {}
        for key, ns, dev in (
            ("sent", self.netns(host), "eth0"),
            ("received", self.bridge_netns, self.port(host)),
        ):
            text = _sh("tc", "-s", "-n", ns, "qdisc", "show", "dev", dev).stdout
            match = re.search(r"Sent (\d+) bytes", text)
            out[key] = int(match.group(1)) if match else 0
        return out

    def command(self, host: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on ``host`` (its own hostname, /etc/hosts, /dev/shm)."""
        return [
            "ip",
            "netns",
            "exec",
            self.netns(host),
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _ENTER,
            "sdpnb-enter",
            host,
            str(self.hosts_file(host)),
            self.shm_size,
            *argv,
        ]

    def popen(
        self,
        host: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in a process group of its own (its output to ``log``)."""
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below, the child has it
        try:
            proc = subprocess.Popen(
                self.command(host, argv),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=cwd,
            )
        finally:
            if log:
                out.close()
        self.procs.append(proc)
        return proc

    def run(
        self,
        host: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to its end; its process group is killed on timeout."""
        proc = subprocess.Popen(
            self.command(host, argv),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            cwd=cwd,
        )
        self.procs.append(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(proc.args, timeout, out, err) from None
        finally:
            if proc.poll() is None:
                _killpg(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def kill_host(self, host: str) -> None:
        """Every process on ``host`` killed (SIGKILL, by PID) and its link down: the machine is gone."""
        self.link_down(host)
        for pid in _sh("ip", "netns", "pids", self.netns(host), check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def down(self) -> None:
        """Remove everything :meth:`up` created; safe to call twice and after a partial ``up``."""
        if not self._up:
            return
        for proc in self.procs:
            _killpg(proc)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for ns in [n for n in _netns_names() if n.startswith(self.prefix + "-")]:
            _kill_namespace(ns)
        if self.directory != Path() and self.directory.name.startswith(self.prefix):
            shutil.rmtree(self.directory, ignore_errors=True)
        _LIVE.pop(self.prefix, None)
        self._up = False

    def leftovers(self) -> list[str]:
        """Namespaces of this run that still exist (empty after :meth:`down`)."""
        return [n for n in _netns_names() if n.startswith(self.prefix + "-")]

    def __enter__(self) -> NetBed:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _killpg(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _down_all() -> None:
    for bed in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            bed.down()


atexit.register(_down_all)


def install_signal_teardown() -> None:
    """On SIGTERM (and SIGHUP), tear every live bed down and exit; SIGINT already raises
    KeyboardInterrupt, which runs ``finally`` blocks and then ``atexit``."""

    def handler(signum, _frame):
        _down_all()
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


# ---------------------------------------------------------------------- a Spark cluster on it
SPARK_MASTER_PORT = 7077


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def source_root() -> Path:
    """The ``src`` directory holding the sparkdp being tested."""
    import sparkdp

    return Path(sparkdp.__file__).resolve().parents[1]


@dataclass
class SparkOnNetBed:
    """A Spark standalone Master on one host, one Worker on each of ``workers``, the driver on
    ``driver``; executors run ``python`` (PYSPARK_PYTHON) with sparkdp's source on PYTHONPATH.

    Workers are started without ``--host``: Spark picks the host's address itself, as on a
    machine nobody configured (through the hostname, or, when that is loopback, the interfaces).
    """

    bed: NetBed
    workers: list[str]
    master: str = "master"
    driver: str = "driver"
    cores: int = 1
    memory: str = "2g"
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def master_url(self) -> str:
        return f"spark://{self.bed.address(self.master)}:{SPARK_MASTER_PORT}"

    def env(self, **more: str) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARK_", "PYSPARK_", "MASTER_", "GLOO_", "PYTEST_"))
        }
        pythonpath = os.pathsep.join([str(source_root()), *filter(None, [os.environ.get("PYTHONPATH")])])
        return {
            **keep,
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": self.python,
            "PYSPARK_DRIVER_PYTHON": self.python,
            "PYTHONPATH": pythonpath,
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOG_DIR": str(self.bed.directory / "logs"),
            **self.extra_env,
            **more,
        }

    def log(self, name: str) -> Path:
        (self.bed.directory / "logs").mkdir(exist_ok=True)
        return self.bed.directory / "logs" / f"{name}.log"

    def start(self, timeout_s: float = 120.0) -> SparkOnNetBed:
        spark_class = str(spark_home() / "bin" / "spark-class")
        self.bed.popen(
            self.master,
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.bed.address(self.master),
                "--port",
                str(SPARK_MASTER_PORT),
                "--webui-port",
                "0",
            ],
            env=self.env(),
            log=self.log("master"),
        )
        for host in self.workers:
            work = self.bed.directory / "work" / host
            work.mkdir(parents=True)
            self.bed.popen(
                host,
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(work),
                    self.master_url,
                ],
                env=self.env(),
                log=self.log(f"worker-{host}"),
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log("master").read_text(errors="replace") if self.log("master").exists() else ""
            if text.count("Registering worker") >= len(self.workers):
                return self
            dead = [p for p in self.bed.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"a Spark daemon exited ({dead[0].returncode}); see {self.bed.directory / 'logs'}"
                )
            time.sleep(0.5)
        raise TimeoutError(
            f"{len(self.workers)} workers did not register with {self.master_url} within "
            f"{timeout_s:.0f} s; see {self.bed.directory / 'logs'}"
        )

    def run_driver(self, argv: list[str], *, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        """Run ``argv`` (e.g. ``[python, "-m", "sparkdp.cli.main", "train", ...]``) on the driver host."""
        return self.bed.run(self.driver, argv, env=self.env(**env), timeout=timeout, cwd=self.bed.directory)


def cluster_hosts(workers: int, servers: int = 0) -> list[str]:
    """The driver, the Spark Master, and one Spark Worker host per training worker and per
    parameter-server task (with one core each, Spark puts one task on each host)."""
    return [
        "driver",
        "master",
        *[f"worker-{i}" for i in range(workers)],
        *[f"server-{i}" for i in range(servers)],
    ]
