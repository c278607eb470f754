"""The JVM's class-data archive: used only when complete, current and private to the user; a JVM
that cannot start with it starts without it."""

import os
import subprocess
import sys
import textwrap

import pytest

from sparkdp.spark import jvm_archive, jvm_archive_build


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty private archive directory and a fixed installation key."""
    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    monkeypatch.setattr(jvm_archive, "archive_key", lambda: "k")
    directory = jvm_archive.archive_dir()
    directory.mkdir(mode=0o700)
    return directory


def _write(path, size):
    path.write_bytes(b"\0" * size)
    path.chmod(0o644)
    return path


def test_an_archive_is_used_only_when_its_size_is_the_one_in_its_name(cache):
    archive = _write(cache / "k-10.jsa", 10)
    assert jvm_archive.usable_archive() == archive
    with open(archive, "r+b") as fh:  # a truncated file: a JVM mapping it dies of SIGBUS
        fh.truncate(6)
    assert jvm_archive.usable_archive() is None
    _write(cache / "other-6.jsa", 6)  # another installation's archive
    assert jvm_archive.usable_archive() is None


def test_an_archive_others_can_write_is_not_used(cache):
    archive = _write(cache / "k-8.jsa", 8)
    archive.chmod(0o664)
    assert jvm_archive.usable_archive() is None
    archive.chmod(0o644)
    cache.chmod(0o770)  # a directory others write to: they could swap the file
    assert jvm_archive.usable_archive() is None
    cache.chmod(0o700)
    assert jvm_archive.usable_archive() == archive


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_an_archive_of_another_user_is_not_used(cache):
    archive = _write(cache / "k-8.jsa", 8)
    os.chown(archive, 4321, 4321)
    assert jvm_archive.usable_archive() is None


def test_a_link_is_not_used(cache, tmp_path):
    target = _write(tmp_path / "elsewhere.jsa", 8)
    (cache / "k-8.jsa").symlink_to(target)
    assert jvm_archive.usable_archive() is None


def test_the_key_changes_with_a_spark_jar(tmp_path, monkeypatch):
    if jvm_archive.archive_key() is None:
        pytest.skip("no java on this machine")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    (jars / "spark-core.jar").write_bytes(b"1")
    first = jvm_archive.archive_key()
    assert jvm_archive.archive_key() == first
    (jars / "spark-core.jar").write_bytes(b"12")
    assert jvm_archive.archive_key() != first
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert len({first, jvm_archive.archive_key()}) == 2


def test_options_that_choose_sharing_themselves_are_left_alone():
    assert jvm_archive.manages_sharing("-Dx=1 -Xshare:off")
    assert jvm_archive.manages_sharing("-XX:SharedArchiveFile=/a.jsa")
    assert not jvm_archive.manages_sharing("-Dlog4j2.configurationFile=file:/x -Xmx2g")
    path = jvm_archive.archive_dir() / "k-1.jsa"
    assert jvm_archive.java_options(path).startswith(f"-XX:SharedArchiveFile={path} -Xshare:auto")


_DAMAGED_SESSION = textwrap.dedent(
    """
    import logging
    from sparkdp.spark.session import session, stop_quietly

    logging.basicConfig(level=logging.WARNING)
    spark = session("local[1]", warm_up=False)
    args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    print("SharedArchiveFile" in str(args), spark.range(5).count())
    stop_quietly()
    """
)


@pytest.mark.spark
@pytest.mark.timeout(180)
def test_a_jvm_that_cannot_map_the_archive_starts_without_it_and_the_archive_goes(tmp_path):
    """A damaged archive whose size matches its name (the check a size cannot make): the JVM dies
    of it, and the session starts again without it."""
    built = jvm_archive.usable_archive()
    if built is None:
        pytest.skip(
            "no JVM class archive on this machine (make setup builds it: sparkdp env --build-jvm-archive)"
        )
    key = jvm_archive.archive_key()
    cache = tmp_path / "cache"
    (cache / "jvm").mkdir(parents=True, mode=0o700)
    damaged = cache / "jvm" / f"{key}-100000.jsa"
    with open(built, "rb") as src, open(damaged, "wb") as dst:
        dst.write(src.read(100_000))  # the header of a 150 MB archive, its regions cut off
    damaged.chmod(0o644)
    env = {**os.environ, "SPARKDP_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", _DAMAGED_SESSION],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "5"]  # after the dying JVM's report
    assert "starting without it" in done.stderr
    assert not damaged.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cache"
    ]  # no JVM crash report in the working directory


@pytest.mark.spark
def test_the_session_maps_the_machines_archive(spark):
    """The suite's session started from the machine's archive, when there is one."""
    built = jvm_archive.usable_archive()
    if built is None:
        pytest.skip(
            "no JVM class archive on this machine (make setup builds it: sparkdp env --build-jvm-archive)"
        )
    jvm = spark.sparkContext._jvm
    args = str(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={built}" in args


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_build_writes_an_archive_that_a_jvm_must_map(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDP_CACHE", str(tmp_path))
    path = jvm_archive_build.build()
    assert path.parent == jvm_archive.archive_dir() and path.name.startswith(f"{jvm_archive.archive_key()}-")
    assert jvm_archive.usable_archive() == path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
