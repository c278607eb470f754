"""The driver JVM's compilers: C1 only on local masters unless asked otherwise (spark/session.py)."""

from __future__ import annotations

import pytest

from sparkdp.errors import ConfigError
from sparkdp.spark.session import jit_java_options

BASE = "-Dlog4j2.configurationFile=file:/x.properties"


def test_local_masters_compile_with_c1_only_unless_asked_otherwise():
    assert jit_java_options(None, "local[2]", BASE) == f"{BASE} -XX:TieredStopAtLevel=1"
    assert jit_java_options(None, "local-cluster[2,1,1024]", BASE).endswith("-XX:TieredStopAtLevel=1")
    assert jit_java_options("full", "local[2]", BASE) == BASE


def test_other_masters_keep_the_jvms_own_compilers_unless_asked_otherwise():
    assert jit_java_options(None, "spark://198.18.0.1:7077", BASE) == BASE
    assert jit_java_options("quick", "yarn", BASE) == f"{BASE} -XX:TieredStopAtLevel=1"


@pytest.mark.parametrize(
    "own", ["-XX:-TieredCompilation", "-XX:TieredStopAtLevel=3", "-XX:CompilationMode=high-only"]
)
def test_a_users_own_choice_of_compilers_wins(own):
    assert jit_java_options("quick", "local[2]", f"{BASE} {own}") == f"{BASE} {own}"


def test_an_unknown_choice_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match="'quick'.*'full'"):
        jit_java_options("c2", "local[2]", BASE)


@pytest.mark.spark
def test_the_suites_local_session_runs_c1_only(spark):
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert bean.getVMOption("TieredStopAtLevel").getValue() == "1"
