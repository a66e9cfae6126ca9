"""The JVM class-data archive (AppCDS) of Spark's classes: where it is and the options that use it.

WHY: a cold Spark driver spends most of its start loading, verifying and parsing the classes of
Spark's jars. A dynamic CDS archive (`-XX:ArchiveClassesAtExit`, JDK 13+) holds those classes
already parsed and verified, mapped read-only into every JVM that names it
(`-XX:SharedArchiveFile`): about half the JVM's CPU at start (`make bench-cds`,
bench/results/cds.json; docs/ARCHITECTURE.md, "Class-data archive").

`make jar` writes it (`jvm/cds.py`) beside the jar in the package (python/sparkgnn/jars/), from a
driver that starts a local session and runs a small workload touching what sparkgnn's jobs load
(DataFrames from Arrow, Python UDFs, shuffles, Parquet, broadcasts). The JVM checks the archive
itself: one written by another JDK build or for another class path is refused at start and the
JVM loads its classes as without it (its CDS logging is off, so a job's output carries no warning
about it). Which class path a JVM runs decides: the archive holds the classes of the path it was
written with (Spark's conf dir and jars, as spark-submit and a local-cluster worker give them).

`java_options()` is what a driver (spark-submit's --driver-java-options, $SPARK_SUBMIT_OPTS) or a
local-cluster executor adds; "" where no archive was built, or where $SPARKGNN_CDS is "off".
$SPARKGNN_CDS may also name an archive file to use instead. `driver_start()` is how local_session
gives them to the driver it starts: through $SPARK_SUBMIT_OPTS while pyspark runs spark-submit,
which adds them to the driver's own options; WHY not spark.driver.extraJavaOptions: a --conf of it
would replace what a spark-defaults.conf sets for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


#: The environment variable spark-submit adds to the driver JVM's options.
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"


@contextmanager
def driver_start() -> Iterator[None]:
    """While a local driver is started inside it: $SPARK_SUBMIT_OPTS with the archive's options
    appended (when there is an archive); restored on the way out."""
    before = os.environ.get(SUBMIT_OPTS)
    options = with_java_options(before)
    if options:
        os.environ[SUBMIT_OPTS] = options
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SUBMIT_OPTS, None)
        else:
            os.environ[SUBMIT_OPTS] = before
