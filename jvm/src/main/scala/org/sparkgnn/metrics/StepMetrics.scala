package org.sparkgnn.metrics

import scala.collection.mutable

import org.apache.spark.{SparkContext, Success}
import org.apache.spark.scheduler.{SparkListener, SparkListenerStageCompleted, SparkListenerTaskEnd}
import org.apache.spark.sparkgnn.ListenerBusAccess

/** Per-step Spark metrics for sparkgnn's progress lines and reports: shuffle bytes written and
  * read, task run and CPU time, tasks that succeeded and failed, stages completed, summed over the
  * tasks that ended since the last `drain`.
  *
  * Why a listener: the Python side used to walk Spark's status store over py4j after every step
  * (one call per stage, and a private API whose signature changes between versions). The listener
  * sums the same task metrics as they arrive, and one call per step returns them.
  * Shuffle bytes and times count successful task attempts only, as the status store does; failed
  * attempts (a lost executor) are counted apart.
  */
class StepListener extends SparkListener {
  private val totals = mutable.LinkedHashMap[String, Long](
    "shuffle_write_bytes" -> 0L,
    "shuffle_read_bytes" -> 0L,
    "task_run_ms" -> 0L,
    "task_cpu_ns" -> 0L,
    "task_gc_ms" -> 0L,
    "tasks" -> 0L,
    "failed_tasks" -> 0L,
    "stages" -> 0L)

  private def add(name: String, value: Long): Unit = totals(name) = totals(name) + value

  override def onTaskEnd(event: SparkListenerTaskEnd): Unit = synchronized {
    val metrics = event.taskMetrics
    if (event.reason != Success || metrics == null) {
      add("failed_tasks", 1L)
    } else {
      add("tasks", 1L)
      add("shuffle_write_bytes", metrics.shuffleWriteMetrics.bytesWritten)
      add("shuffle_read_bytes", metrics.shuffleReadMetrics.totalBytesRead)
      add("task_run_ms", metrics.executorRunTime)
      add("task_cpu_ns", metrics.executorCpuTime)
      add("task_gc_ms", metrics.jvmGCTime)
    }
  }

  override def onStageCompleted(event: SparkListenerStageCompleted): Unit = synchronized {
    add("stages", 1L)
  }

  /** The totals since the last drain, as JSON (names above), and reset them. */
  def drain(): String = synchronized {
    val json = totals.map { case (name, value) => s""""$name": $value""" }.mkString("{", ", ", "}")
    totals.keys.toList.foreach(name => totals(name) = 0L)
    json
  }
}

/** One StepListener per SparkContext, installed on first use. */
object StepMetrics {
  private val listeners = mutable.Map[String, StepListener]()

  def install(sc: SparkContext): StepListener = synchronized {
    listeners.getOrElseUpdate(sc.applicationId, {
      val listener = new StepListener
      sc.addSparkListener(listener)
      listener
    })
  }

  /** Wait (at most `timeoutMillis`) for the listener bus to deliver what the finished jobs posted,
    * then drain the context's listener. A timeout adds "complete": false to the JSON. */
  def drain(sc: SparkContext, timeoutMillis: Long): String = {
    val complete = ListenerBusAccess.waitUntilEmpty(sc, timeoutMillis)
    val json = install(sc).drain()
    json.stripSuffix("}") + s""", "complete": $complete}"""
  }
}
