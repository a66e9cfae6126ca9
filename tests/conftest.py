"""Shared fixtures. One session-scoped local SparkSession for the whole suite (starting one costs
~5-10 s, so tests that need Spark share it)."""

import os
import sys

import pytest

from sparkgnn.engine import cds

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every Spark driver JVM the tests start (the shared session's, the jobs run as subprocesses, the
# spark-submit jobs', the Spark Connect server's: spark-submit adds SPARK_SUBMIT_OPTS to the driver
# JVM's options) compiles with C1 only and collects with one GC thread. The tests' JVM work is small
# and short; on a 2-core machine C2's compiler threads and G1's parallel workers took about half the
# CPU the JVMs burned, and slowed the other test process beside them. What the tests compute is the same.
# They also map the class-data archive of Spark's classes when `make jar` wrote it (engine.cds: half
# the CPU of a driver's start).
JVM_OPTIONS = f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {cds.java_options()}".strip()
os.environ.setdefault("SPARK_SUBMIT_OPTS", JVM_OPTIONS)


@pytest.fixture(scope="session")
def spark():
    from sparkgnn.engine.session import local_session

    session = local_session("sparkgnn-tests", cores=2)
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_cli_log_handler():
    """A command line run in-process (main(argv)) installs the sparkgnn log handler
    (sparkgnn.logs.install_cli_handler) and sets the `sparkgnn` logger's level: both are undone
    after each test, so no later test prints a library's progress lines or depends on the order."""
    import logging

    from sparkgnn.logs import CLI_HANDLER, LOGGER

    logger = logging.getLogger(LOGGER)
    level = logger.level
    yield
    for handler in [h for h in logger.handlers if h.get_name() == CLI_HANDLER]:
        logger.removeHandler(handler)
    logger.setLevel(level)
