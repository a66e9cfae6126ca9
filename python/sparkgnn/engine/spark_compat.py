"""What the engine asks of a SparkSession, answered for a classic session and a Spark Connect one.

Why: Spark 4's standard client is Spark Connect (`SparkSession.builder.remote("sc://...")`). A
Connect session is a gRPC client of a server JVM: it has no `sparkContext`, no accumulators, no
RDDs and no py4j gateway (`_jvm`, `_jsc`), and touching any of them raises
JVM_ATTRIBUTE_NOT_SUPPORTED. DataFrames, `spark.conf`, `mapInArrow` (the server's Python workers
run the function), `localCheckpoint`, Parquet reads and writes, and Structured Streaming all work.
So every use of the JVM-only parts goes through one function here, which takes the classic path
where the session has one and says plainly what a Connect session gets instead: a job tag for a
job description, `spark.conf` for the SparkConf, a small Spark job for the default parallelism,
a DataFrame for an RDD, and "not measured" (None / empty) for accumulators and the status store.

This module imports no pyspark (docs/ARCHITECTURE.md lists the modules that do, inside functions);
it recognises a Connect session by its class's module.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable

CONNECT_MODULE = "pyspark.sql.connect"

# What reports print where a Connect session cannot measure something.
NOT_MEASURED_CONNECT = "not measured (Spark Connect: no accumulators or status store)"


def is_connect(spark) -> bool:
    """A Spark Connect session (pyspark.sql.connect.session.SparkSession), by its class's module:
    no pyspark import needed, and a missing grpc client cannot break the check."""
    return type(spark).__module__.startswith(CONNECT_MODULE)


def has_jvm(spark) -> bool:
    """Whether this process talks to the driver JVM through py4j (classic session): the status
    store, accumulators and RDDs exist only then."""
    return not is_connect(spark)


def driver_is_here(spark) -> bool:
    """Whether the Spark driver runs on this machine. Classic: always (this process talks to it
    over a local py4j socket). Connect: only when the server's host is a loopback name or this
    machine's own name; else a local master's executors and their disk are the server's, not
    this machine's (so this machine's memory and local paths say nothing about them)."""
    if has_jvm(spark):
        return True
    import socket

    host = str(getattr(spark.client, "host", "") or "").strip("[]").lower()
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127."):
        return True
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    return host in names


def conf_get(spark, key: str, default: str | None = None) -> str | None:
    """A Spark setting, on either kind of session. `spark.conf` (the session's SQL conf) holds
    every SparkConf entry the application started with, so it answers what classic code read from
    `sparkContext.getConf()` (spark.master, spark.executor.*, spark.app.id)."""
    try:
        value = spark.conf.get(key, default)
    except Exception:  # noqa: BLE001 - some keys raise instead of returning the default
        return default
    return default if value is None else str(value)


def application_id(spark) -> str:
    """The Spark application's id (classic: sparkContext.applicationId). A Connect server runs
    one application for all its sessions, whose id it reports as the `spark.app.id` conf; failing
    that, the Connect session id (unique per session, so a cache keyed by it is only less shared)."""
    if has_jvm(spark):
        return str(spark.sparkContext.applicationId)
    return conf_get(spark, "spark.app.id") or f"connect-{spark.session_id}"


# -- job descriptions ------------------------------------------------------------------------

# Connect tags of sparkgnn's current job description, per (session id, thread): tags on a
# Connect client are thread-local, like sparkContext's local properties.
_TAGS: dict[tuple[str, int], str] = {}
_TAG_FORBIDDEN = re.compile(r"[,\s]+")


def job_tag(text: str) -> str:
    """A Connect job tag for a description: tags may not contain ',' (Spark's tag separator);
    whitespace becomes '_' too so the tag reads as one token in the UI and in interruptTag."""
    return _TAG_FORBIDDEN.sub("_", text.strip()) or "sparkgnn"


def set_job_description(spark, text: str | None) -> None:
    """Name the Spark jobs that follow (None: stop naming them).

    Classic: sparkContext.setJobDescription (the Spark UI's job description). Connect has no
    description a client can set (the server describes each job as "Spark Connect - <plan>"), so
    the text becomes a job tag (spark.addTag; shown with the job in the UI, and usable with
    spark.interruptTag), replacing the tag this function set before on this thread."""
    if has_jvm(spark):
        spark.sparkContext.setJobDescription(text)
        return
    key = (str(spark.session_id), threading.get_ident())
    previous = _TAGS.pop(key, None)
    if previous is not None:
        try:
            spark.removeTag(previous)
        except Exception:  # noqa: BLE001 - a tag is a label; never fail a job over it
            pass
    if text is not None:
        tag = job_tag(text)
        spark.addTag(tag)
        _TAGS[key] = tag


def set_log_level(spark, level: str) -> None:
    """Classic: the driver's log level. Connect: nothing (the server's log4j config decides; a
    client cannot change it)."""
    if has_jvm(spark):
        spark.sparkContext.setLogLevel(level)


# -- parallelism -----------------------------------------------------------------------------

_LOCAL = re.compile(r"^local(?:\[(\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def parallelism_from_master(master: str) -> int | None:
    """Cores a local master names: local -> 1, local[N] / local[N,F] -> N, local-cluster[n,c,m] ->
    n*c; None for local[*] (the server's cores, which a remote client cannot see) and clusters."""
    master = (master or "").strip()
    match = _LOCAL.match(master)
    if match:
        return int(match.group(1) or 1)
    match = _LOCAL_CLUSTER.match(master)
    if match:
        return int(match.group(1)) * int(match.group(2))
    return None


def default_parallelism(spark) -> int:
    """Total cores as Spark reports them (classic: sparkContext.defaultParallelism).

    Connect: `spark.default.parallelism` if set (what defaultParallelism returns then), else the
    cores a local master names, else asked of Spark itself: spark.range without a partition count
    is split into the default parallelism (leafNodeDefaultParallelism, when that is set), so the
    number of its non-empty partitions is the answer (one small job)."""
    if has_jvm(spark):
        return int(spark.sparkContext.defaultParallelism)
    configured = conf_get(spark, "spark.default.parallelism")
    if configured:
        return int(configured)
    from_master = parallelism_from_master(conf_get(spark, "spark.master") or "")
    if from_master is not None:
        return from_master
    return int(spark.range(0, 1 << 16).selectExpr("spark_partition_id() as p").distinct().count())


# -- task counters (accumulators) ------------------------------------------------------------


def task_counters(spark, sums: Iterable[str], maxima: Iterable[str] = ()) -> dict:
    """Counters tasks add to and the driver reads after the job: float sums for `sums`, the
    largest value added (engine.metrics.MaxParam) for `maxima`, as {name: accumulator}.

    Classic: Spark accumulators. Connect has no accumulators (the client cannot register one
    with the server's SparkContext): an empty dict, which tasks treat as "do not count" and
    reports as not measured (steps.run_partition and the executor's readers accept it)."""
    if not has_jvm(spark):
        return {}
    from sparkgnn.engine.metrics import MaxParam

    sc = spark.sparkContext
    counters = {name: sc.accumulator(0.0) for name in sums}
    counters.update({name: sc.accumulator(0, MaxParam()) for name in maxima})
    return counters


# -- running P Python tasks and collecting what they return ------------------------------------


def run_tasks(spark, parts: int, fn: Callable[[int], bytes], decode: Callable[[bytes], object]) -> list:
    """[decode(fn(0)), ..., decode(fn(parts-1))], each fn(p) in its own Spark task.

    One path for both kinds of session: spark.range(parts) in `parts` partitions and a mapInArrow
    whose task p returns fn(p) as bytes in a binary column (Connect has no RDDs). `fn` encodes its
    own result and `decode` reads it back here, so nothing arriving from the cluster is unpickled
    (the security rule; serving.cgp_wire's Arrow codec is the one used)."""
    parts = int(parts)

    def task(batches):
        import pyarrow as pa

        for batch in batches:
            ids = batch.column(0).to_pylist()
            if ids:
                payloads = [fn(int(p)) for p in ids]
                yield pa.RecordBatch.from_arrays(
                    [pa.array(ids, pa.int64()), pa.array(payloads, pa.binary())], names=["p", "result"]
                )

    rows = spark.range(0, parts, 1, parts).mapInArrow(task, "p long, result binary").collect()
    by_part = {int(row["p"]): row["result"] for row in rows}
    missing = [p for p in range(parts) if p not in by_part]
    if missing:
        raise RuntimeError(f"Spark tasks returned no result for partitions {missing[:5]}")
    return [decode(bytes(by_part[p])) for p in range(parts)]


# -- shuffle metrics of a Connect query ------------------------------------------------------


def query_shuffle_bytes(df) -> dict | None:
    """Shuffle bytes of the last action run on a Connect DataFrame (`df.executionInfo`, filled by
    collect / toPandas, not by localCheckpoint or writes), summed over its Exchange nodes, in
    engine.metrics.ShuffleMeter's form; None where the DataFrame carries no metrics."""
    try:
        metrics = df.executionInfo.metrics if df is not None else None
        # CollectedMetrics keeps its nodes in `_metrics`; its public extract_graph() asserts a
        # single root, which adaptive plans (query stages) break. Optional, so never fail on it.
        nodes = list(metrics._metrics) if metrics is not None else []
        if not nodes:
            return None
        written = read = 0
        for node in nodes:
            values = {m.name: m.value for m in node.metrics}
            written += int(values.get("shuffleBytesWritten", 0))
            read += int(values.get("remoteBytesRead", 0)) + int(values.get("localBytesRead", 0))
    except Exception:  # noqa: BLE001 - metrics are optional
        return None
    return {"shuffle_write_bytes": written, "shuffle_read_bytes": read}
