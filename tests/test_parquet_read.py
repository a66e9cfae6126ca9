"""parquet_read.read_parquet: the schema Spark would infer, taken from a local footer by the
driver, so the read runs no Spark job; what it cannot vouch for (partitioned or remote folders,
no data files) reads as Spark reads it."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.parquet_read import footer_schema, read_parquet


def _jobs(spark, group, fn):
    spark.sparkContext.setJobGroup(group, group)
    try:
        result = fn()
    finally:
        spark.sparkContext.setJobGroup("", "")
    return result, len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_pyarrow_and_spark_written_files_read_with_the_inferred_schema_and_no_job(spark, tmp_path):
    arrow_dir = tmp_path / "arrow"
    arrow_dir.mkdir()
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2)
    table = pa.table(
        {
            "id": pa.array([3, 1, 2], pa.int64()),
            "x": x,
            "y": pa.array([0, 1, None], pa.int32()),
            "split": pa.array(["train", None, "test"]),
            "w": pa.array([1.0, 2.0, 3.0], pa.float32()),
        }
    )
    pq.write_table(table, arrow_dir / "part-0.parquet")
    (arrow_dir / "_SUCCESS").write_text("")
    spark_dir = str(tmp_path / "spark")
    spark.createDataFrame([(1, [1.0, 2.0], "a")], "id long, h array<float>, s string").write.parquet(spark_dir)
    for path in (str(arrow_dir), str(arrow_dir / "part-0.parquet"), spark_dir, "file://" + spark_dir):
        inferred = spark.read.parquet(path)
        frame, jobs = _jobs(spark, "read-" + path, lambda p=path: read_parquet(spark, p))
        assert jobs == 0, path
        assert frame.schema == inferred.schema, path
        assert sorted(map(tuple, frame.collect())) == sorted(map(tuple, inferred.collect()))


def test_what_the_driver_cannot_vouch_for_is_read_by_spark(spark, tmp_path):
    partitioned = str(tmp_path / "parts")
    spark.createDataFrame([(1, 0), (2, 1)], "id long, part int").write.partitionBy("part").parquet(partitioned)
    assert footer_schema((partitioned,)) is None  # Spark adds `part` from the folder names
    assert sorted(read_parquet(spark, partitioned).columns) == ["id", "part"]
    assert footer_schema(("s3://bucket/graph/vertices",)) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert footer_schema((str(empty),)) is None
    with pytest.raises(Exception, match="(?i)infer schema"):  # Spark's own error for a folder without data
        read_parquet(spark, str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "part-0.parquet").write_bytes(b"not parquet")
    assert footer_schema((str(broken),)) is None
