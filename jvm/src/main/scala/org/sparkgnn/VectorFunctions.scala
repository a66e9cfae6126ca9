package org.sparkgnn

import org.apache.spark.sql.catalyst.expressions.{BinaryExpression, Expression, ImplicitCastInputTypes, UnaryExpression, UnsafeArrayData}
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenFallback
import org.apache.spark.sql.catalyst.util.ArrayData
import org.apache.spark.sql.types.{ArrayType, BinaryType, DataType, FloatType}

/** sparkgnn_vec_scale(vector, factor): factor x vector, packed (a message scaled by an edge weight or
  * a per-source factor, for SQL users who build messages before aggregating). */
case class VectorScale(left: Expression, right: Expression)
    extends BinaryExpression
    with ImplicitCastInputTypes
    with CodegenFallback {
  override def inputTypes: Seq[DataType] = Seq(BinaryType, FloatType)
  override def dataType: DataType = BinaryType
  override def prettyName: String = "sparkgnn_vec_scale"
  override protected def nullSafeEval(vector: Any, factor: Any): Any =
    PackedVectors.scale(vector.asInstanceOf[Array[Byte]], factor.asInstanceOf[Float], prettyName)
  override protected def withNewChildrenInternal(newLeft: Expression, newRight: Expression): VectorScale =
    copy(left = newLeft, right = newRight)
}

/** sparkgnn_vec_to_array(vector): a packed vector as array<float> (to read the engine's vectors). */
case class VectorToArray(child: Expression) extends UnaryExpression with ImplicitCastInputTypes with CodegenFallback {
  override def inputTypes: Seq[DataType] = Seq(BinaryType)
  override def dataType: DataType = ArrayType(FloatType, containsNull = false)
  override def prettyName: String = "sparkgnn_vec_to_array"
  override protected def nullSafeEval(vector: Any): Any =
    UnsafeArrayData.fromPrimitiveArray(PackedVectors.unpack(vector.asInstanceOf[Array[Byte]], prettyName))
  override protected def withNewChildInternal(newChild: Expression): VectorToArray = copy(child = newChild)
}

/** sparkgnn_array_to_vec(array): array<float> (or any numeric array, cast) packed as the engine's
  * binary vector. A null element cannot be packed and fails the query, naming its position. */
case class ArrayToVector(child: Expression) extends UnaryExpression with ImplicitCastInputTypes with CodegenFallback {
  override def inputTypes: Seq[DataType] = Seq(ArrayType(FloatType))
  override def dataType: DataType = BinaryType
  override def prettyName: String = "sparkgnn_array_to_vec"
  override protected def nullSafeEval(array: Any): Any = {
    val data = array.asInstanceOf[ArrayData]
    var i = 0
    while (i < data.numElements()) {
      if (data.isNullAt(i)) throw new IllegalArgumentException(s"$prettyName: element $i of the array is null")
      i += 1
    }
    PackedVectors.pack(data.toFloatArray())
  }
  override protected def withNewChildInternal(newChild: Expression): ArrayToVector = copy(child = newChild)
}
