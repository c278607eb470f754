"""Checks of the machine Spark needs (Java, a reachable master) with actionable errors."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from urllib.parse import urlparse

from ..errors import EnvironmentProblem
from ..redact import redact

MIN_JAVA = 17


def java_executable() -> str | None:
    """The `java` Spark will start (``$JAVA_HOME/bin/java``, else the one on PATH), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return java if java and os.path.exists(java) else None


def java_major_version() -> int | None:
    """The major version of the `java` Spark will start, or None when there is none."""
    java = java_executable()
    if java is None:
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_java() -> None:
    """Raise :class:`EnvironmentProblem` unless Java >= 17 is available to PySpark."""
    major = java_major_version()
    if major is None:
        raise EnvironmentProblem(
            "PySpark needs Java 17 or newer, and no `java` was found (JAVA_HOME unset and no java on PATH). "
            "Install it, e.g. `apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME."
        )
    if major < MIN_JAVA:
        raise EnvironmentProblem(
            f"PySpark 4 needs Java {MIN_JAVA} or newer, but the java found is version {major}. "
            "Install a newer JDK (e.g. `apt-get install -y openjdk-17-jre-headless`) and point JAVA_HOME at it."
        )


def check_master_reachable(master: str, timeout_s: float = 5.0) -> None:
    """For ``spark://host:port`` masters, fail fast when nothing listens there.

    Spark itself retries registration for about a minute and then prints a long
    Java stack trace; a plain TCP connect gives the user the answer in seconds.
    """
    if not master.startswith("spark://"):
        return
    for hostport in master[len("spark://") :].split(","):
        parsed = urlparse(f"spark://{hostport}")
        host, port = parsed.hostname, parsed.port or 7077
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as exc:
            reason = exc.strerror or str(exc)
            last = f"{host}:{port} ({reason})"
    raise EnvironmentProblem(
        f"Cannot reach the Spark master {redact(master)!r}: tried {last}. "
        "Check the URL (host and port of `spark-class org.apache.spark.deploy.master.Master`), "
        "that the master is running, and that no firewall blocks the port; "
        "or leave --master unset to use the embedded local[N] Spark."
    )
