"""The JVM class-data archive (AppCDS) of Spark's classes: where it is and the options that use it.

WHY: a cold Spark driver spends most of its start loading, verifying and parsing the classes of
Spark's jars. Measured on a 2-core machine, a local session's start plus one small job burned
21.5 s of JVM CPU (12.3 s with the archive) and took 15.7 s of wall time (9.6 s); with the test
suite's JVM options (C1 only, serial GC) 11.8 s -> 5.5 s of CPU. A dynamic CDS archive
(`-XX:ArchiveClassesAtExit`, JDK 13+) holds those classes already parsed and verified, mapped
read-only into every JVM that names it (`-XX:SharedArchiveFile`).

`make jar` writes it (`jvm/cds.py`) beside the jar in the package (python/sparkgnn/jars/), from a
driver that starts a local session and runs a small workload touching what sparkgnn's jobs load
(DataFrames from Arrow, Python UDFs, shuffles, Parquet, broadcasts). The JVM checks the archive
itself: one written by another JDK build or for another class path is refused at start and the
JVM loads its classes as without it (its CDS logging is off, so a job's output carries no warning
about it). Which class path a JVM runs decides: the archive holds the classes of the path it was
written with (Spark's conf dir and jars, as spark-submit and a local-cluster worker give them).

`java_options()` is what a driver (local_session's spark.driver.extraJavaOptions, spark-submit's
--driver-java-options) or a local-cluster executor adds; "" where no archive was built, or where
$SPARKGNN_CDS is "off". $SPARKGNN_CDS may also name an archive file to use instead.
"""

from __future__ import annotations

import os
from pathlib import Path

ARCHIVE_NAME = "spark-classes.jsa"
#: "off", or the path of an archive to use instead of the package's.
ARCHIVE_ENV = "SPARKGNN_CDS"
#: The archive's JVM logging off: a mismatched archive (another JDK, another class path) is then
#: dropped silently instead of printing a warning into a job's standard output.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def default_archive() -> Path:
    """Where `make jar` writes the archive: beside the jar in the package (python/sparkgnn/jars/)."""
    return Path(__file__).resolve().parent.parent / "jars" / ARCHIVE_NAME


def archive_path() -> str | None:
    """The archive a JVM should map: $SPARKGNN_CDS when it names a file, else the package's when
    built; None when there is none or $SPARKGNN_CDS is "off"."""
    configured = os.environ.get(ARCHIVE_ENV, "").strip()
    if configured.lower() == "off":
        return None
    path = Path(configured) if configured else default_archive()
    return str(path.resolve()) if path.is_file() else None


def java_options() -> str:
    """JVM options that map the archive, or "" without one."""
    path = archive_path()
    if path is None or " " in path:  # JVM option strings are split on spaces
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def with_java_options(existing: str | None) -> str:
    """`existing` JVM options (may be None or empty) followed by `java_options()`, each once."""
    ours = java_options()
    current = (existing or "").strip()
    if not ours or ours in current:
        return current
    return f"{current} {ours}".strip()
