"""Shared fixtures. One session-scoped local SparkSession for the whole suite (starting one costs
~5-10 s, so tests that need Spark share it)."""

import os
import sys

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    from sparkgnn.engine.session import local_session

    session = local_session("sparkgnn-tests", cores=2)
    yield session
    session.stop()
