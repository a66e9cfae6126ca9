package org.sparkgnn

import org.apache.spark.sql.{SparkSession, SparkSessionExtensions}
import org.apache.spark.sql.catalyst.FunctionIdentifier
import org.apache.spark.sql.catalyst.expressions.{Expression, ExpressionInfo, Literal}
import org.apache.spark.sql.types.{FloatType, IntegerType, LongType, ShortType}

/** The SQL functions of this module, one registry for both ways to install them:
  *   - `Functions.register(spark)`: into a running session (what the Python side calls through py4j);
  *   - `--conf spark.sql.extensions=org.sparkgnn.SparkGNNExtensions`: into every session, for Scala
  *     and SQL users (spark-sql, spark-shell) who never start Python.
  */
object Functions {
  type Builder = Seq[Expression] => Expression

  /** sparkgnn_vec_<kind>(vector, width[, weight]): `width` is an integer literal (the buffer's
    * shape is fixed when the query is planned); weight defaults to 1. */
  private def aggregate(kind: String): Builder = { arguments =>
    val name = s"sparkgnn_vec_$kind"
    if (arguments.length != 2 && arguments.length != 3) {
      throw new IllegalArgumentException(s"$name(vector, width[, weight]) takes 2 or 3 arguments, got ${arguments.length}")
    }
    val width = arguments(1) match {
      case Literal(value: Int, IntegerType) => value
      case Literal(value: Long, LongType) if value.isValidInt => value.toInt
      case Literal(value: Short, ShortType) => value.toInt
      case other => throw new IllegalArgumentException(s"$name: width must be an integer literal, got ${other.sql}")
    }
    if (width <= 0) throw new IllegalArgumentException(s"$name: width must be positive, got $width")
    val weight = if (arguments.length == 3) arguments(2) else Literal(1.0f, FloatType)
    VectorAggregate(arguments.head, weight, width, kind).toAggregateExpression()
  }

  private def unary(name: String, build: Expression => Expression): Builder = { arguments =>
    if (arguments.length != 1) throw new IllegalArgumentException(s"$name takes 1 argument, got ${arguments.length}")
    build(arguments.head)
  }

  private val scale: Builder = { arguments =>
    if (arguments.length != 2) {
      throw new IllegalArgumentException(s"sparkgnn_vec_scale(vector, factor) takes 2 arguments, got ${arguments.length}")
    }
    VectorScale(arguments(0), arguments(1))
  }

  /** name -> (usage, builder). */
  val all: Map[String, (String, Builder)] =
    Reduction.byName.keys.map { kind =>
      s"sparkgnn_vec_$kind" -> (
        s"sparkgnn_vec_$kind(vector, width[, weight]) - $kind of weight * vector over a group of packed float32 vectors",
        aggregate(kind))
    }.toMap ++ Map(
      "sparkgnn_vec_scale" -> ("sparkgnn_vec_scale(vector, factor) - factor * vector, packed", scale),
      "sparkgnn_vec_to_array" -> (
        "sparkgnn_vec_to_array(vector) - a packed float32 vector as array<float>",
        unary("sparkgnn_vec_to_array", VectorToArray(_))),
      "sparkgnn_array_to_vec" -> (
        "sparkgnn_array_to_vec(array) - array<float> packed as a float32 vector (binary)",
        unary("sparkgnn_array_to_vec", ArrayToVector(_)))
    )

  def infoFor(name: String, usage: String): ExpressionInfo =
    new ExpressionInfo(classOf[VectorAggregate].getCanonicalName, null, name, usage, "", "", "", "", "", "", "")

  /** Install every function into `spark` as temporary functions (idempotent: a second call
    * replaces them); returns the names. */
  def register(spark: SparkSession): Array[String] = {
    val registry = spark.asInstanceOf[org.apache.spark.sql.classic.SparkSession].sessionState.functionRegistry
    all.foreach { case (name, (_, builder)) =>
      registry.createOrReplaceTempFunction(name, builder, "scala_udf")
    }
    all.keys.toArray.sorted
  }
}

/** spark.sql.extensions entry point: every session of the application gets the functions. */
class SparkGNNExtensions extends (SparkSessionExtensions => Unit) {
  override def apply(extensions: SparkSessionExtensions): Unit = {
    Functions.all.foreach { case (name, (usage, builder)) =>
      extensions.injectFunction((FunctionIdentifier(name), Functions.infoFor(name, usage), builder))
    }
  }
}
