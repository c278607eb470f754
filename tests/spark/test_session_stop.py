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
    from sparkdp.spark.session import stop_quietly

    # the second session is stopped as the command line does: its JVM exits at once, while the
    # accumulator server's handler may still be polling the JVM's connection
    for rows, stop in ((4, lambda spark: spark.stop()), (5, lambda spark: stop_quietly())):
        spark = sparkdp.session("local[2]", warm_up=False)
        total = spark.sparkContext.accumulator(0)
        spark.sparkContext.parallelize(range(rows), 2).foreach(lambda x: total.add(x))
        started = time.perf_counter()
        stop(spark)
        print(total.value, round(time.perf_counter() - started, 3))
    time.sleep(1.5)  # longer than the handler's poll: it has read the hang-up
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
    assert float(lines[0][1]) < 0.5, done.stdout
    # the hang-up of a JVM that exited after the stop is not printed as an error
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
