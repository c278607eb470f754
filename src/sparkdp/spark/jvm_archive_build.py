"""Building the JVM's class-data archive (:mod:`sparkdp.spark.jvm_archive`): a child process runs a
session that does what sparkdp's jobs do and ends its JVM, which writes the archive as it exits;
a second child must start a JVM that maps it (``-Xshare:on``: it fails rather than run without
it). Only then is the file renamed to the name sessions look for.

Run as ``sparkdp env --build-jvm-archive``; ``python -m sparkdp.spark.jvm_archive_build`` is the
children's entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import EnvironmentProblem
from .jvm_archive import QUIET, archive_dir, archive_key, archive_name, private_to_user
from .session import driver_java_options, session, stop_quietly

log = logging.getLogger(__name__)

#: archives kept in the directory, the newest (about 190 MB each)
KEPT = 3
#: seconds each child of a build may take (a session, its jobs and the archive's dump: about 20 s)
BUILD_STEP_TIMEOUT_S = 300


def build(timeout_s: float = BUILD_STEP_TIMEOUT_S) -> Path:
    """Write this installation's archive (about a minute and 190 MB on a 2-core machine) and return its path."""
    key = archive_key()
    if key is None:
        raise EnvironmentProblem(
            "no `java` was found (JAVA_HOME unset and no java on PATH): install Java 17+."
        )
    directory = archive_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not private_to_user(os.stat(directory)):
        raise EnvironmentProblem(
            f"{directory} belongs to another user or others can write to it; the JVM runs what an archive "
            "there holds. Make it yours (chmod go-w) or set SPARKDP_CACHE to a directory of your own."
        )
    tmp = directory / f".{key}.{os.getpid()}.jsa.tmp"  # this build's own name: the JVM creates it as it exits
    try:
        started = time.monotonic()
        _run_child("--dump", tmp, timeout_s)
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise EnvironmentProblem(
                f"the JVM wrote no class archive to {tmp}; this Java may not support -XX:ArchiveClassesAtExit."
            )
        _run_child("--check", tmp, timeout_s)
        size = tmp.stat().st_size
        os.chmod(tmp, 0o644)
        final = directory / archive_name(key, size)
        os.replace(tmp, final)
        _remove_older(directory, keep=final)
        log.info("JVM class archive %s written in %.1f s", final, time.monotonic() - started)
        return final
    finally:
        tmp.unlink(missing_ok=True)


def _remove_older(directory: Path, keep: Path) -> None:
    """Keep :data:`KEPT` archives (each installation, e.g. each virtual environment, has its own),
    the newest; running JVMs keep the files they mapped."""
    others = sorted(
        (p for p in directory.glob("*.jsa") if p != keep), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for old in others[KEPT - 1 :]:
        old.unlink(missing_ok=True)


def _run_child(step: str, path: Path, timeout_s: float) -> None:
    command = [sys.executable, "-m", "sparkdp.spark.jvm_archive_build", step, str(path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentProblem(
            f"building the JVM class archive: {step} took over {timeout_s:.0f} s"
        ) from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EnvironmentProblem(f"building the JVM class archive: {step} failed: {' / '.join(tail)}")


def _dump(path: Path) -> None:
    """A session that runs what sparkdp's jobs run, then its JVM's exit, which writes the archive."""
    spark = session(
        "local[2]",
        conf={
            "spark.driver.extraJavaOptions": f"{driver_java_options()} -XX:ArchiveClassesAtExit={path} {QUIET}"
        },
    )
    _exercise(spark)
    # ends the JVM, which writes the archive as it exits
    status = stop_quietly(timeout_s=BUILD_STEP_TIMEOUT_S)
    if status != 0:
        raise SystemExit(f"the JVM ended with status {status} while writing {path}")


def _exercise(spark) -> None:
    """The kinds of work sparkdp's jobs give the JVM: a barrier Arrow stage (training), an Arrow
    UDF (prediction, generation), Parquet written and read, and an aggregation."""
    import pyspark.sql.functions as F

    df = spark.range(0, 4096, numPartitions=2).selectExpr("id", "cast(id as float) as x")

    def same(batches):
        yield from batches

    df.mapInArrow(same, df.schema, barrier=True).count()
    df.select(F.arrow_udf(lambda x: x, "float")(F.col("x"))).collect()  # type: ignore[call-overload]
    with tempfile.TemporaryDirectory() as tmp:
        df.write.parquet(f"{tmp}/table")
        spark.read.parquet(f"{tmp}/table").groupBy((F.col("id") % 3).alias("k")).agg(F.sum("x")).collect()


def _check(path: Path) -> None:
    """A session whose JVM must map ``path`` (``-Xshare:on`` fails instead of running without it)."""
    spark = session(
        "local[1]",
        conf={
            "spark.driver.extraJavaOptions": f"{driver_java_options()} -XX:SharedArchiveFile={path} -Xshare:on {QUIET}"
        },
        warm_up=False,
    )
    spark.range(10).count()
    stop_quietly()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkdp.spark.jvm_archive_build", description=__doc__.splitlines()[0]
    )
    step = parser.add_mutually_exclusive_group(required=True)
    step.add_argument(
        "--dump", type=Path, metavar="PATH", help="run a session whose JVM writes PATH at its exit"
    )
    step.add_argument("--check", type=Path, metavar="PATH", help="start a JVM that must map PATH")
    args = parser.parse_args(argv)
    if args.dump:
        _dump(args.dump)
    else:
        _check(args.check)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
