package org.sparkgnn

import java.lang.Float.{floatToRawIntBits, intBitsToFloat}
import java.nio.ByteBuffer

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{AttributeReference, Expression, ImplicitCastInputTypes}
import org.apache.spark.sql.catalyst.expressions.aggregate.ImperativeAggregate
import org.apache.spark.sql.catalyst.types.DataTypeUtils
import org.apache.spark.sql.types.{BinaryType, DataType, FloatType, LongType, StructType}

/** What one aggregate function computes over the (weighted) vectors of a group.
  *
  * @param additive accumulate sums (sum, mean, sum_count) rather than extremes (max, min)
  * @param sign     extremes: max keeps max(x), min keeps max(-x) and negates it back, so both share
  *                 one loop (NaN propagates either way, like torch's amax/amin)
  * @param output   the packed result from the accumulated values and the row count
  */
final case class Reduction(additive: Boolean, sign: Float, output: (Array[Float], Long) => Array[Float]) {
  def identity: Float = if (additive) 0.0f else Float.NegativeInfinity
}

object Reduction {
  private def values(acc: Array[Float], n: Long): Array[Float] = acc

  /** name (without the sparkgnn_vec_ prefix) -> reduction. The engine's aggregation states:
    * sum -> [s], mean -> [s | n] (sum_count), max / min -> [m]. */
  val byName: Map[String, Reduction] = Map(
    "sum" -> Reduction(additive = true, 1.0f, values),
    "sum_count" -> Reduction(additive = true, 1.0f, (acc, n) => acc :+ n.toFloat),
    "mean" -> Reduction(additive = true, 1.0f, (acc, n) => acc.map(_ / n.toFloat)),
    "max" -> Reduction(additive = false, 1.0f, values),
    "min" -> Reduction(additive = false, -1.0f, (acc, _) => acc.map(-_))
  )
}

/** A typed aggregate over packed float32 vectors (`binary`), with Spark's partial (map-side)
  * aggregation: `sparkgnn_vec_<kind>(vector, width[, weight])` reduces weight * vector over a group.
  *
  * Why an ImperativeAggregate with a fixed-width buffer, not an `Aggregator` or a
  * TypedImperativeAggregate: both of those keep an object per group and run in
  * ObjectHashAggregateExec, which falls back to sorting its input after 128 groups
  * (spark.sql.objectHashAggregate.sortBased.fallbackThreshold), and serialise the object at the
  * shuffle. Here the buffer is `width` float32 values packed two per long (UnsafeRow gives every
  * field 8 bytes: one float per field would double the partial states Spark shuffles) plus the row
  * count, so HashAggregateExec keeps it in its Tungsten hash map and shuffles it as it lies. No
  * element is boxed: the input is read as longs from the binary value, the buffer as longs.
  *
  * Rows whose vector or weight is null are skipped; a group with no row gives null (as SQL's sum).
  * A vector whose byte length is not 4 x width fails the query with a message naming both.
  */
case class VectorAggregate(
    vector: Expression,
    weight: Expression,
    width: Int,
    kind: String,
    mutableAggBufferOffset: Int = 0,
    inputAggBufferOffset: Int = 0)
    extends ImperativeAggregate
    with ImplicitCastInputTypes {

  require(width > 0, s"sparkgnn_vec_$kind: width must be positive, got $width")
  private val reduction: Reduction = Reduction.byName.getOrElse(
    kind,
    throw new IllegalArgumentException(s"unknown vector aggregate $kind; known: ${Reduction.byName.keys.mkString(", ")}"))
  private val words = (width + 1) / 2
  private def function = s"sparkgnn_vec_$kind"

  override def children: Seq[Expression] = Seq(vector, weight)
  override def inputTypes: Seq[DataType] = Seq(BinaryType, FloatType)
  override def nullable: Boolean = true
  override def dataType: DataType = BinaryType
  override def prettyName: String = function

  override lazy val aggBufferAttributes: Seq[AttributeReference] =
    (0 until words).map(i => AttributeReference(s"w$i", LongType, nullable = false)()) :+
      AttributeReference("n", LongType, nullable = false)()
  override lazy val aggBufferSchema: StructType = DataTypeUtils.fromAttributes(aggBufferAttributes)
  override lazy val inputAggBufferAttributes: Seq[AttributeReference] = aggBufferAttributes.map(_.newInstance())

  override def withNewMutableAggBufferOffset(offset: Int): ImperativeAggregate =
    copy(mutableAggBufferOffset = offset)
  override def withNewInputAggBufferOffset(offset: Int): ImperativeAggregate = copy(inputAggBufferOffset = offset)
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[Expression]): VectorAggregate =
    copy(vector = newChildren(0), weight = newChildren(1))

  private def pair(low: Float, high: Float): Long =
    (floatToRawIntBits(low).toLong & 0xffffffffL) | (floatToRawIntBits(high).toLong << 32)
  private def low(word: Long): Float = intBitsToFloat(word.toInt)
  private def high(word: Long): Float = intBitsToFloat((word >>> 32).toInt)

  override def initialize(buffer: InternalRow): Unit = {
    val identity = pair(reduction.identity, reduction.identity)
    var j = 0
    while (j < words) {
      buffer.setLong(mutableAggBufferOffset + j, identity)
      j += 1
    }
    buffer.setLong(mutableAggBufferOffset + words, 0L)
  }

  /** Floats 2j and 2j+1 of a packed vector as one little-endian long (low half first); an odd
    * width's last word holds one float and a zero. One read per two floats. */
  private def word(values: ByteBuffer, j: Int): Long =
    if (2 * j + 1 < width) values.getLong(8 * j)
    else floatToRawIntBits(values.getFloat(8 * j)).toLong & 0xffffffffL

  override def update(buffer: InternalRow, input: InternalRow): Unit = {
    val bytes = vector.eval(input)
    val factor = weight.eval(input)
    if (bytes == null || factor == null) return
    val packed = bytes.asInstanceOf[Array[Byte]]
    PackedVectors.checkWidth(packed, width, function)
    val values = PackedVectors.view(packed)
    val scale = factor.asInstanceOf[Float] * reduction.sign
    val offset = mutableAggBufferOffset
    var j = 0
    if (reduction.additive) {
      while (j < words) {
        val acc = buffer.getLong(offset + j)
        val in = word(values, j)
        buffer.setLong(offset + j, pair(low(acc) + scale * low(in), high(acc) + scale * high(in)))
        j += 1
      }
    } else {
      while (j < words) {
        val acc = buffer.getLong(offset + j)
        val in = word(values, j)
        buffer.setLong(offset + j, pair(Math.max(low(acc), scale * low(in)), Math.max(high(acc), scale * high(in))))
        j += 1
      }
    }
    buffer.setLong(offset + words, buffer.getLong(offset + words) + 1L)
  }

  override def merge(buffer: InternalRow, inputBuffer: InternalRow): Unit = {
    var j = 0
    while (j < words) {
      val mine = buffer.getLong(mutableAggBufferOffset + j)
      val theirs = inputBuffer.getLong(inputAggBufferOffset + j)
      val merged =
        if (reduction.additive) pair(low(mine) + low(theirs), high(mine) + high(theirs))
        else pair(Math.max(low(mine), low(theirs)), Math.max(high(mine), high(theirs)))
      buffer.setLong(mutableAggBufferOffset + j, merged)
      j += 1
    }
    val counts = buffer.getLong(mutableAggBufferOffset + words) + inputBuffer.getLong(inputAggBufferOffset + words)
    buffer.setLong(mutableAggBufferOffset + words, counts)
  }

  override def eval(buffer: InternalRow): Any = {
    val count = buffer.getLong(mutableAggBufferOffset + words)
    if (count == 0L) return null
    val acc = new Array[Float](width)
    var i = 0
    while (i < width) {
      val word = buffer.getLong(mutableAggBufferOffset + i / 2)
      acc(i) = if (i % 2 == 0) low(word) else high(word)
      i += 1
    }
    PackedVectors.pack(reduction.output(acc, count))
  }
}
