"""Representative keys route a row to exactly the partition it names."""

import pyspark.sql.functions as F

from sparkgnn.engine.routing import key_expr, partition_keys, route


def test_rows_land_in_the_partition_they_name(spark):
    for partitions in (1, 3, 8):
        keys = partition_keys(spark, partitions)
        rows = spark.range(0, 200).selectExpr(f"cast(id % {partitions} as int) as pt")
        routed = route(rows.selectExpr(f"{key_expr(keys, 'pt')} as k", "pt"), partitions)
        mismatched = routed.where(F.spark_partition_id() != F.col("pt")).count()
        assert mismatched == 0
