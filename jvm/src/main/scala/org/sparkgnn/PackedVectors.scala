package org.sparkgnn

import java.nio.{ByteBuffer, ByteOrder}

/** The engine's vector layout: float32 values packed little-endian into one `binary` value
  * (`sparkgnn.arrowvec.pack_binary` on the Python side), 4 bytes per float, no header.
  *
  * Why binary and not array<float>: Spark's generic arrays box or copy element by element on every
  * conversion (the probe in docs/PLATFORM.md: a Scala Aggregator over array<float> took 11.8 s for
  * one 2M-edge layer), while a binary value is one byte array the functions read in place.
  */
object PackedVectors {
  val FloatBytes = 4

  /** A little-endian view of `bytes` (no copy). */
  def view(bytes: Array[Byte]): ByteBuffer = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN)

  /** Floats in a packed vector; refuses a length that is not a whole number of floats. */
  def width(bytes: Array[Byte], function: String): Int = {
    if (bytes.length % FloatBytes != 0) {
      throw new VectorWidthException(
        s"$function: a vector of ${bytes.length} bytes is not packed float32 (not a multiple of 4 bytes)")
    }
    bytes.length / FloatBytes
  }

  /** Refuse a vector whose width is not the aggregate's: the message names both. */
  def checkWidth(bytes: Array[Byte], width: Int, function: String): Unit = {
    if (bytes.length != width * FloatBytes) {
      val floats = if (bytes.length % FloatBytes == 0) s"${bytes.length / FloatBytes} floats" else "not packed float32"
      throw new VectorWidthException(
        s"$function: a vector of ${bytes.length} bytes ($floats) in an aggregate of width $width " +
          s"(${width * FloatBytes} bytes per vector)")
    }
  }

  def pack(values: Array[Float]): Array[Byte] = {
    val out = new Array[Byte](values.length * FloatBytes)
    val buffer = view(out)
    var i = 0
    while (i < values.length) {
      buffer.putFloat(i * FloatBytes, values(i))
      i += 1
    }
    out
  }

  def unpack(bytes: Array[Byte], function: String): Array[Float] = {
    val n = width(bytes, function)
    val buffer = view(bytes)
    val out = new Array[Float](n)
    var i = 0
    while (i < n) {
      out(i) = buffer.getFloat(i * FloatBytes)
      i += 1
    }
    out
  }

  def scale(bytes: Array[Byte], factor: Float, function: String): Array[Byte] = {
    val values = unpack(bytes, function)
    var i = 0
    while (i < values.length) {
      values(i) *= factor
      i += 1
    }
    pack(values)
  }
}

/** A vector of the wrong width (or not packed float32 at all) reached a sparkgnn function. */
class VectorWidthException(message: String) extends IllegalArgumentException(message)
