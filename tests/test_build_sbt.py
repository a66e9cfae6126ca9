"""build.sbt and jvm/build.py describe the same jar: same sources, the Scala and Spark versions of the
pinned pyspark; the jar `make jar` built holds the classes the Python side calls, and its stamp
matches the sources (so a rebuild is skipped only when nothing changed)."""

import importlib.util
import re
import zipfile
from pathlib import Path

import pyspark
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build_module():
    spec = importlib.util.spec_from_file_location("jvm_build", ROOT / "jvm" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sbt_setting(pattern: str) -> str:
    found = re.search(pattern, (ROOT / "build.sbt").read_text())
    assert found, f"build.sbt has no {pattern}"
    return found.group(1)


def test_sbt_versions_are_the_pinned_pysparks():
    build = _build_module()
    jars = build.pyspark_jars()
    scala_library = build._jar(jars, "scala-library").name  # scala-library-2.13.x.jar
    scala_version = _sbt_setting(r'scalaVersion := "([^"]+)"')
    assert scala_library == f"scala-library-{scala_version}.jar"
    assert _sbt_setting(r'val sparkVersion = "([^"]+)"') == pyspark.__version__


def test_sbt_and_make_compile_the_same_sources():
    build = _build_module()
    assert 'scalaSource := baseDirectory.value / "jvm" / "src" / "main" / "scala"' in (ROOT / "build.sbt").read_text()
    assert build.SOURCES == ROOT / "jvm" / "src" / "main" / "scala"
    assert build.scala_sources(), "no Scala sources"


def test_built_jar_holds_what_python_calls_and_is_current():
    build = _build_module()
    jar = build.DEFAULT_JAR
    if not jar.exists():
        pytest.skip("the jar is not built (make jar)")
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
    for cls in ("org/sparkgnn/Functions", "org/sparkgnn/metrics/StepMetrics", "org/sparkgnn/SparkGNNExtensions"):
        assert f"{cls}.class" in names
    stamp = jar.with_name(jar.name + ".sha256").read_text().strip()
    assert stamp == build.source_key(build.scala_sources(), build.pyspark_jars())
    assert build.build(jar) is False  # current: the stamp skips the compile
