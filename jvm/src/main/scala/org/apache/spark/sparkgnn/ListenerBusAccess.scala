package org.apache.spark.sparkgnn

import java.util.concurrent.TimeoutException

import org.apache.spark.SparkContext

/** Waits until Spark's listener bus has delivered every event posted so far.
  *
  * Why in Spark's package: the bus is private[spark]. A job's stage- and task-end events are posted
  * before the action returns to the driver, but listeners receive them on the bus's own thread,
  * so a metric read right after an action can miss the job's last tasks. Spark's own tests wait
  * the same way.
  */
object ListenerBusAccess {

  /** True when the bus drained within `timeoutMillis`, false when it timed out. */
  def waitUntilEmpty(sc: SparkContext, timeoutMillis: Long): Boolean =
    try {
      sc.listenerBus.waitUntilEmpty(timeoutMillis)
      true
    } catch {
      case _: TimeoutException => false
    }
}
