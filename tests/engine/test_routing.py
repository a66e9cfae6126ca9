"""Representative keys route a row to exactly the partition it names."""

import numpy as np
import pyspark.sql.functions as F

from sparkgnn.engine.routing import key_expr, partition_keys, route


def test_rows_land_in_the_partition_they_name(spark):
    for partitions in (1, 3, 8):
        keys = partition_keys(spark, partitions)
        rows = spark.range(0, 200).selectExpr(f"cast(id % {partitions} as int) as pt")
        routed = route(rows.selectExpr(f"{key_expr(keys, 'pt')} as k", "pt"), partitions)
        mismatched = routed.where(F.spark_partition_id() != F.col("pt")).count()
        assert mismatched == 0


def test_numpy_owner_partition_is_sparks_hash(spark):
    # the files exchange's feature scan places vertices with owner_partition: it must be the
    # partition pmod(hash(id), n) gives every other part of the engine, for any long id
    from sparkgnn.engine.routing import owner_partition, partition_expr, spark_hash_long

    rng = np.random.default_rng(0)
    ids = np.concatenate(
        [np.arange(-50, 50), rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64), [2**63 - 1, -(2**63), 2**32]]
    ).astype(np.int64)
    frame = spark.createDataFrame([(int(i),) for i in ids], "id long")
    for n in (1, 3, 8, 14):
        rows = frame.selectExpr("id", "hash(id) as h", f"{partition_expr('id', n)} as p").toPandas()
        order = {int(i): k for k, i in enumerate(rows["id"])}
        positions = [order[int(i)] for i in ids]
        assert spark_hash_long(ids).tolist() == rows["h"].to_numpy()[positions].tolist()
        assert owner_partition(ids, n).tolist() == rows["p"].to_numpy()[positions].tolist()
