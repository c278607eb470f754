"""Run a piece of code in a fresh interpreter whose address space is capped: a decoder that
allocates beyond its bound fails there with MemoryError, not by taking the machine's memory.

The code calls ``cap(budget)`` once it has imported what it needs and built its input: from then
on the process may map ``budget`` bytes more than it has mapped (RLIMIT_AS counts virtual
memory, so the cap is taken relative to what is already there: torch's libraries, the input).
One thread for torch and OpenMP, so no thread's stack or malloc arena is mapped after the cap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_PRELUDE = """
import re, resource, torch
torch.set_num_threads(1)

def cap(budget):
    with open("/proc/self/status") as status:
        mapped = int(re.search(r"VmSize:\\s+(\\d+) kB", status.read()).group(1)) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = mapped + budget if hard == resource.RLIM_INFINITY else min(hard, mapped + budget)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
"""


def run_capped(code: str, timeout_s: float = 50.0) -> subprocess.CompletedProcess[str]:
    """``code`` (dedented) after a prelude defining ``cap``; its output, whatever its exit status."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
