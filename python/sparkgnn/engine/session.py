"""One place that builds a local SparkSession the way sparkgnn needs it.

Why: Spark's Python workers must run the same interpreter as the driver (else "No module named
pyarrow"), adaptive query execution must not coalesce shuffle partitions (the executor routes
rows to partition indexes and relies on partition i of a shuffle being task i), and a local
session should bind to loopback. A Spark Connect session (SPARK_REMOTE=sc://..., or one the caller built
with SparkSession.builder.remote) is used as it is: its server owns master, memory and Python
settings, and only the runtime SQL settings of REQUIRED_CONF can be set from here (`configure`);
what a Connect session lacks (sparkContext) is answered by engine.spark_compat.
"""

from __future__ import annotations

import os
import sys

from sparkgnn.engine import cds, spark_compat

# Settings sparkgnn relies on in any session (local or cluster); applied by `configure`.
REQUIRED_CONF = {
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

#: The Spark setting that names the module Python workers are forked from, and the variable that
#: turns sparkgnn's (sparkgnn.pydaemon) off for local sessions.
DAEMON_KEY = "spark.python.daemon.module"
PYDAEMON_ENV = "SPARKGNN_PYDAEMON"

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "4g",
    "spark.python.worker.reuse": "true",
    # Python workers forked from a daemon that imported torch and the task modules (sparkgnn.pydaemon)
    DAEMON_KEY: "sparkgnn.pydaemon",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",
    # Rows are mostly packed float32 vectors, which lz4 barely shrinks; on one machine compressing
    # them only costs CPU (measured: a 200K/2M/128 replicate layer 5.4 s -> 2.9 s without it).
    "spark.shuffle.compress": "false",
}


def _point_python_at_this_interpreter() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_session(app_name: str = "sparkgnn", cores: int | str = "*", extra_conf: dict | None = None):
    """Create (or return the active) local SparkSession with sparkgnn's settings."""
    _point_python_at_this_interpreter()
    from pyspark.sql import SparkSession

    from sparkgnn.engine.jvm import session_conf

    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    conf = local_conf(extra_conf)
    conf.update(session_conf(conf.get("spark.jars")))  # the sparkgnn JVM jar, when built (engine.jvm)
    for key, value in conf.items():
        builder = builder.config(key, value)
    with cds.driver_start():  # the driver JVM maps the class-data archive of Spark's classes, when built
        spark = builder.getOrCreate()
    spark_compat.set_log_level(spark, "ERROR")
    return spark


def local_conf(extra_conf: dict | None = None) -> dict:
    """The settings of a local session: LOCAL_CONF and REQUIRED_CONF, then `extra_conf`. With
    $SPARKGNN_PYDAEMON=off (and no daemon in `extra_conf`) the workers fork from pyspark's plain
    daemon instead of sparkgnn.pydaemon."""
    conf = {**LOCAL_CONF, **REQUIRED_CONF}
    if os.environ.get(PYDAEMON_ENV, "").strip().lower() == "off":
        del conf[DAEMON_KEY]
    return {**conf, **(extra_conf or {})}


def job_session(app_name: str):
    """The session a job script (spark_jobs/) runs in: the active one (e.g. a notebook or a test
    that started it), the one spark-submit set up (its master and conf are kept, this only names
    the app), a Spark Connect session when SPARK_REMOTE names a server (`sc://host:port`, pyspark's
    own convention; `spark-submit --remote` sets it), else a local session with sparkgnn's settings
    (plain `python script.py`)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if os.environ.get("SPARK_REMOTE"):  # Spark Connect: master and conf are the server's
        return SparkSession.builder.remote(os.environ["SPARK_REMOTE"]).appName(app_name).getOrCreate()
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit: keep its master and conf
        return SparkSession.builder.appName(app_name).getOrCreate()
    return local_session(app_name)


def active_session():
    """The SparkSession active in this process, or None. In a Spark Connect server's foreachBatch
    process that is the session of the micro-batch being handled (what a pickled executor that
    left its own session behind runs its tasks with, serving.spark_cgp)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def configure(spark) -> None:
    """Apply the settings sparkgnn relies on to a session the user built (e.g. spark-submit or a
    Spark Connect session: both are runtime SQL settings, which a Connect client may set)."""
    for key, value in REQUIRED_CONF.items():
        spark.conf.set(key, value)


def _bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = text.strip().lower().rstrip("b")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text) * 2**20


# Address space of a Python worker before it holds any data: interpreter + torch + pyarrow mapped
# (measured VmSize 0.83 GB). RLIMIT_AS counts it, so a cap must leave room for it.
WORKER_BASELINE_BYTES = 2**30
# Share of this machine's memory that Spark's Python workers may hold in local mode (the rest is
# the JVM's heap, its shuffle files in the page cache and the OS).
LOCAL_PYTHON_SHARE = 0.5


def memory_per_task(spark) -> int:
    """Memory budget per Python task handed to the planner: what one task's worker may hold at its
    peak. The planner's estimate already counts every copy a row has at once and the worker's own
    resident baseline (planner.partitions: MEMORY_MARGIN, WORKER_RSS_BYTES), so the budget is not
    divided again. With spark.executor.pyspark.memory set, Spark
    caps every Python worker at that amount divided by spark.executor.cores (RLIMIT_AS, which counts
    the worker's own baseline); else LOCAL_PYTHON_SHARE of this machine's memory divided among the
    cores (local mode: Python workers live outside the JVM heap). Settings are read through
    spark.conf, which holds the application's SparkConf on a classic and a Connect session alike.
    A Connect client on another machine than its server sees only its own memory: set
    spark.executor.pyspark.memory on such a server."""
    cores = max(spark_compat.default_parallelism(spark), 1)
    configured = spark_compat.conf_get(spark, "spark.executor.pyspark.memory")
    if configured:
        cap = _bytes(configured) // max(int(spark_compat.conf_get(spark, "spark.executor.cores", "1") or 1), 1)
        return max(cap - WORKER_BASELINE_BYTES, cap // 8)
    import psutil

    return int(psutil.virtual_memory().total * LOCAL_PYTHON_SHARE / cores)


# What the JVM (driver heap, metaspace, Netty buffers: 2.8 GiB resident during the 100M-edge job's
# prepare) and the OS keep of the share LOCAL_PYTHON_SHARE leaves.
JVM_AND_OS_BYTES = 4 << 30


def mapped_memory_budget(spark) -> int | None:
    """Page cache the planner may count on for exchange files that tasks read in place (memory-mapped
    payloads, planner.partitions): in local mode what the Python workers' share leaves once the JVM
    and the OS are served; None where executors run elsewhere (their page cache is not this
    machine's, and payloads are mapped only where every task shares the work dir's local disk), which
    includes a local master behind a Spark Connect server on another machine."""
    master = spark_compat.conf_get(spark, "spark.master", "") or ""
    if not (master == "local" or master.startswith(("local[", "local-cluster["))):
        return None
    if not spark_compat.driver_is_here(spark):
        return None
    import psutil

    total = psutil.virtual_memory().total
    return max(int(total * (1 - LOCAL_PYTHON_SHARE)) - JVM_AND_OS_BYTES, total // 8)
