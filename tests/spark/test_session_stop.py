"""spark.stop() on a sparkdp session returns without waiting for PySpark's accumulator server."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import time
    import sparkdp

    for rows in (4, 5):
        spark = sparkdp.session("local[2]", warm_up=False)
        total = spark.sparkContext.accumulator(0)
        spark.sparkContext.parallelize(range(rows), 2).foreach(lambda x: total.add(x))
        started = time.perf_counter()
        spark.stop()
        print(total.value, round(time.perf_counter() - started, 3))
    """
)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_stop_returns_at_once_and_a_next_session_counts_its_own_updates():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split() for line in done.stdout.splitlines()[-2:]]
    assert [int(values) for values, _ in lines] == [6, 10]  # sum(range(4)), sum(range(5))
    # PySpark's own stop waited 0.93 s here for the server's handler to look at its flag
    assert all(float(seconds) < 0.5 for _, seconds in lines), done.stdout
