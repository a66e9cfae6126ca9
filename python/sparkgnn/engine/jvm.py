"""The sparkgnn JVM module (`jvm/`, built by `make jar` or sbt): where the jar is, how a session
gets it, and what it offers a session that has it.

What it offers (docs/ARCHITECTURE.md, "The JVM module"):
  - SQL functions over the engine's packed float32 vectors (`binary`): the aggregates
    sparkgnn_vec_sum / _mean / _sum_count / _max / _min (vector, width[, weight]) with Spark's
    partial aggregation, sparkgnn_vec_scale, sparkgnn_vec_to_array and sparkgnn_array_to_vec. The
    `pushdown` strategy (planner.strategies) aggregates a layer with them inside Spark.
  - A SparkListener (org.sparkgnn.metrics.StepMetrics) that sums per-step shuffle bytes and task
    times for the progress lines (engine.metrics).

Why optional: the jar is a build product. A session without it (a spark-submit without --jars, a
Spark Connect server that was not given it) still runs every other strategy, and the planner says
why pushdown is blocked. A local session built here gets it through spark.jars (local_session).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkgnn.engine.spark_compat import application_id, has_jvm

JAR_NAME = "sparkgnn-jvm_2.13.jar"
#: Overrides where the jar is looked for (e.g. a jar built by sbt).
JAR_ENV = "SPARKGNN_JAR"
FUNCTIONS_CLASS = "org.sparkgnn.Functions"
#: SQL functions the jar registers (what functions_available checks for).
FUNCTIONS = (
    "sparkgnn_vec_sum",
    "sparkgnn_vec_mean",
    "sparkgnn_vec_sum_count",
    "sparkgnn_vec_max",
    "sparkgnn_vec_min",
    "sparkgnn_vec_scale",
    "sparkgnn_vec_to_array",
    "sparkgnn_array_to_vec",
)
#: Longest wait for Spark's listener bus to deliver a finished step's events (engine.metrics).
LISTENER_TIMEOUT_MS = 10_000


def jar_path() -> str | None:
    """The jar to give Spark: $SPARKGNN_JAR, else the one `make jar` writes into the package
    (python/sparkgnn/jars/); None when neither exists."""
    configured = os.environ.get(JAR_ENV)
    if configured:
        if not Path(configured).is_file():
            raise FileNotFoundError(f"{JAR_ENV}={configured} names no file")
        return str(Path(configured).resolve())
    built = Path(__file__).resolve().parent.parent / "jars" / JAR_NAME
    return str(built) if built.is_file() else None


def session_conf(existing: str | None = None) -> dict[str, str]:
    """Settings that put the jar on a session being built ({} without a jar): appended to any
    spark.jars the caller set."""
    jar = jar_path()
    if jar is None:
        return {}
    jars = [j for j in (existing or "").split(",") if j]
    return {"spark.jars": ",".join(jars + ([jar] if jar not in jars else []))}


# (application id, session) -> whether the functions are registered there: temporary functions
# belong to one SparkSession (spark.newSession() starts without them)
_REGISTERED: dict[tuple[str, int], bool] = {}


def _gateway_class(spark, name: str):
    """A JVM class through py4j, or None when the driver's class path lacks it (py4j then hands
    back a JavaPackage, which is not callable)."""
    from py4j.java_gateway import JavaClass

    target = spark.sparkContext._jvm
    for part in name.split("."):
        target = getattr(target, part)
    return target if isinstance(target, JavaClass) else None


def functions_available(spark) -> bool:
    """Register the jar's SQL functions in `spark` when its driver has the jar, and say whether
    they are there. A Spark Connect session cannot register anything from the client; it has them
    when its server was started with the jar and spark.sql.extensions=org.sparkgnn.SparkGNNExtensions."""
    key = (application_id(spark), id(spark))
    if key not in _REGISTERED:
        if has_jvm(spark):
            functions = _gateway_class(spark, FUNCTIONS_CLASS)
            if functions is not None:
                functions.register(spark._jsparkSession)
        names = {row[0] for row in spark.sql("show functions like 'sparkgnn_*'").collect()}
        _REGISTERED[key] = all(name in names for name in FUNCTIONS)
    return _REGISTERED[key]


def why_unavailable(spark) -> str | None:
    """None when the functions are there, else one line a plan can show."""
    if functions_available(spark):
        return None
    if jar_path() is None:
        return "the sparkgnn JVM jar is not built (make jar)"
    return f"this Spark session has not loaded the sparkgnn JVM jar (spark.jars={jar_path()})"


class StepListener:
    """Python face of org.sparkgnn.metrics.StepMetrics: totals of the tasks that ended since the
    last drain (shuffle bytes, task times, tasks, failed tasks, stages)."""

    def __init__(self, spark, metrics_class) -> None:
        self._sc = spark.sparkContext._jsc.sc()
        self._metrics = metrics_class
        self._metrics.install(self._sc)

    def drain(self, timeout_ms: int = LISTENER_TIMEOUT_MS) -> dict:
        return json.loads(self._metrics.drain(self._sc, int(timeout_ms)))


def step_listener(spark) -> StepListener | None:
    """The jar's listener installed on this session's SparkContext, or None (no jar on the driver,
    or a Connect session: no gateway)."""
    if not has_jvm(spark):
        return None
    metrics = _gateway_class(spark, "org.sparkgnn.metrics.StepMetrics")
    return None if metrics is None else StepListener(spark, metrics)
