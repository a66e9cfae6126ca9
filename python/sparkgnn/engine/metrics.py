"""Shuffle bytes (and, with the sparkgnn jar, task times) per step.

With the sparkgnn JVM jar on the driver (engine.jvm), a SparkListener sums the task metrics of
each step as they arrive (org.sparkgnn.metrics.StepMetrics): one py4j call per step returns the
shuffle bytes, the task run / CPU / GC time and the tasks that succeeded and failed. Without it,
the shuffle bytes come from Spark's own status store (what the Spark UI shows), reached through
the JVM gateway because PySpark exposes no stage metrics, one call per stage; if a Spark version
changes that internal API the metric is reported as None rather than failing the job. A Spark
Connect session has no gateway: there the meter reads the shuffle bytes a collected DataFrame
carries (`delta(df)`, engine.spark_compat.query_shuffle_bytes) and reports None (not measured)
for steps materialised otherwise (localCheckpoint, writes carry no metrics to the client)."""

from __future__ import annotations

from sparkgnn.engine.jvm import step_listener
from sparkgnn.engine.spark_compat import has_jvm, query_shuffle_bytes


class MaxParam:
    """Accumulator that keeps the largest value added (Spark's AccumulatorParam protocol, duck-typed
    so this module needs no pyspark): tasks add their Python worker's peak RSS, the driver reads
    the largest, to set the planner's memory estimate against what a task really used."""

    def zero(self, value):
        return 0

    def addInPlace(self, value1, value2):  # noqa: N802 (Spark's name)
        return max(value1, value2)


class ShuffleMeter:
    def __init__(self, spark) -> None:
        self._sc = spark.sparkContext if has_jvm(spark) else None
        # why a step's shuffle reads None (printed by reports); None while the status store answers
        self.not_measured: str | None = None if self._sc is not None else "Spark Connect: no status store"
        self._listener = step_listener(spark) if self._sc is not None else None
        if self._listener is not None:
            self._listener.drain()  # start from here: what ran before is not this run's
            self._seen: set = set()
        else:
            self._seen = self._stage_ids()

    def _stage_list(self):
        if self._sc is None:
            return None
        try:
            jvm = self._sc._jvm
            no_quantiles = self._sc._gateway.new_array(jvm.double, 0)
            # Scala default arguments are invisible to py4j: pass all five.
            stages = (
                self._sc._jsc.sc().statusStore().stageList(None, False, False, no_quantiles, jvm.java.util.ArrayList())
            )
            return list(jvm.scala.jdk.javaapi.CollectionConverters.asJava(stages))
        except Exception:  # noqa: BLE001 - private API; metrics are optional
            return None

    def _stage_ids(self) -> set:
        stages = self._stage_list()
        return set() if stages is None else {int(s.stageId()) for s in stages}

    def delta(self, df=None) -> dict | None:
        """Shuffle bytes written/read by stages that completed since the last call. Connect: the
        shuffle bytes of the last action collected from `df` (None without one)."""
        if self._sc is None:
            return query_shuffle_bytes(df)
        if self._listener is not None:
            return _from_listener(self._listener.drain())
        stages = self._stage_list()
        if stages is None:
            return None
        written = read = 0
        for stage in stages:
            stage_id = int(stage.stageId())
            if stage_id in self._seen:
                continue
            self._seen.add(stage_id)
            written += int(stage.shuffleWriteBytes())
            read += int(stage.shuffleRemoteBytesRead()) + int(stage.shuffleLocalBytesRead())
        return {"shuffle_write_bytes": written, "shuffle_read_bytes": read}


def _from_listener(totals: dict) -> dict:
    """The listener's totals in the form the reports print: shuffle bytes as before, plus the tasks'
    summed run and CPU time in seconds, their count, failed attempts and whether the listener bus
    delivered every event in time (`complete`)."""
    return {
        "shuffle_write_bytes": int(totals["shuffle_write_bytes"]),
        "shuffle_read_bytes": int(totals["shuffle_read_bytes"]),
        "task_run_s": round(totals["task_run_ms"] / 1e3, 3),
        "task_cpu_s": round(totals["task_cpu_ns"] / 1e9, 3),
        "task_gc_s": round(totals["task_gc_ms"] / 1e3, 3),
        "tasks": int(totals["tasks"]),
        "failed_tasks": int(totals["failed_tasks"]),
        "listener_complete": bool(totals["complete"]),
    }
