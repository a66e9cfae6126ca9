"""The class-data archive of Spark's classes (engine.cds, written by jvm/cds.py in `make jar`): the
options that name it, that a driver the tests start really maps it, that a JVM given it for
another class path starts without a word about it, and that a current stamp skips the build."""

import os
import subprocess
import sys

import pytest

from sparkgnn.engine import cds

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "jvm"))
import cds as cds_build  # noqa: E402  (jvm/cds.py, the builder)


def test_the_options_name_the_archive_once_and_off_or_a_missing_file_gives_none(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"not read here")
    monkeypatch.setenv(cds.ARCHIVE_ENV, str(archive))
    options = cds.java_options()
    assert options.startswith(f"-XX:SharedArchiveFile={archive.resolve()} ") and cds.QUIET in options
    assert cds.with_java_options(None) == options
    assert cds.with_java_options("-Dx=1") == f"-Dx=1 {options}"
    assert cds.with_java_options(f"-Dx=1 {options}") == f"-Dx=1 {options}"  # once
    monkeypatch.setenv(cds.ARCHIVE_ENV, "off")
    assert cds.java_options() == "" and cds.with_java_options("-Dx=1") == "-Dx=1"
    monkeypatch.setenv(cds.ARCHIVE_ENV, str(tmp_path / "missing.jsa"))
    assert cds.archive_path() is None and cds.java_options() == ""


def test_a_driver_start_appends_the_options_to_spark_submit_opts_and_restores_them(tmp_path, monkeypatch):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"not read here")
    monkeypatch.setenv(cds.ARCHIVE_ENV, str(archive))
    monkeypatch.setenv(cds.SUBMIT_OPTS, "-Dmine=1")
    with cds.driver_start():
        assert os.environ[cds.SUBMIT_OPTS] == f"-Dmine=1 {cds.java_options()}"
    assert os.environ[cds.SUBMIT_OPTS] == "-Dmine=1"
    monkeypatch.delenv(cds.SUBMIT_OPTS)
    with cds.driver_start():
        assert os.environ[cds.SUBMIT_OPTS] == cds.java_options()
    assert cds.SUBMIT_OPTS not in os.environ


def test_the_tests_driver_maps_the_archive_make_jar_wrote(spark):
    path = cds.archive_path()
    if path is None:
        pytest.skip("no class-data archive (make jar writes it where the JDK can)")
    driver = spark.sparkContext._gateway.proc.pid  # spark-submit, exec'd into the driver JVM
    with open(f"/proc/{driver}/maps") as maps:
        assert path in maps.read(), "the driver JVM was given the archive but did not map it"


def test_a_jvm_given_an_archive_of_another_class_path_starts_quietly():
    path = cds.archive_path()
    if path is None:
        pytest.skip("no class-data archive (make jar writes it where the JDK can)")
    result = subprocess.run(["java", *cds.java_options().split(), "-version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "cds" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr


def test_a_current_stamp_skips_the_build(tmp_path, capsys):
    archive = tmp_path / "classes.jsa"
    archive.write_bytes(b"kept")
    (tmp_path / "classes.jsa.sha256").write_text(cds_build.archive_key() + "\n")
    assert cds_build.build(archive) is False
    assert archive.read_bytes() == b"kept"
    assert "is up to date" in capsys.readouterr().out
