"""The JVM module's SQL functions (jvm/, engine.jvm) against numpy: the vector aggregates with and
without weights, over groups spread across partitions (Spark's partial + final aggregation),
NaN, null rows, empty groups, width mismatches, and the scalar conversions."""

import numpy as np
import pytest

from sparkgnn.engine import jvm

pytestmark = pytest.mark.skipif(jvm.jar_path() is None, reason="the sparkgnn JVM jar is not built (make jar)")

WIDTH = 7  # odd: the buffer packs two floats per field, so the last field holds one float and padding


@pytest.fixture(scope="module")
def vectors(spark):
    assert jvm.functions_available(spark), jvm.why_unavailable(spark)
    rng = np.random.default_rng(11)
    n = 400
    x = rng.standard_normal((n, WIDTH)).astype(np.float32)
    groups = rng.integers(0, 23, n)
    weight = rng.uniform(-2, 2, n).astype(np.float32)
    rows = [(int(g), v.tobytes(), float(w)) for g, v, w in zip(groups, x, weight, strict=True)]
    frame = spark.createDataFrame(rows, "g long, v binary, w float").repartition(5)  # groups span partitions
    frame.createOrReplaceTempView("vectors")
    return x, groups, weight


def _by_group(spark, sql: str) -> dict[int, np.ndarray]:
    return {row[0]: np.frombuffer(row[1], np.float32) for row in spark.sql(sql).collect()}


REFERENCES = {
    "sum": lambda m: m.sum(0),
    "mean": lambda m: m.mean(0),
    "sum_count": lambda m: np.concatenate([m.sum(0), [len(m)]]),
    "max": lambda m: m.max(0),
    "min": lambda m: m.min(0),
}


@pytest.mark.parametrize("kind", sorted(REFERENCES))
@pytest.mark.parametrize("weighted", [False, True])
def test_aggregates_equal_numpy(spark, vectors, kind, weighted):
    x, groups, weight = vectors
    argument = ", w" if weighted else ""
    got = _by_group(spark, f"select g, sparkgnn_vec_{kind}(v, {WIDTH}{argument}) from vectors group by g")
    assert sorted(got) == sorted(set(groups.tolist()))
    for g, value in got.items():
        messages = x[groups == g] * (weight[groups == g, None] if weighted else 1.0)
        np.testing.assert_allclose(value, REFERENCES[kind](messages), rtol=1e-5, atol=1e-5)


def test_partial_aggregation_in_the_tungsten_hash_map(spark, vectors):
    """The aggregate runs map-side (partial_...) and in HashAggregateExec, never in the object hash
    aggregate that falls back to sorting after 128 groups."""
    plan = spark.sql(f"select g, sparkgnn_vec_sum(v, {WIDTH}) from vectors group by g")._jdf.queryExecution()
    text = plan.executedPlan().toString()
    assert "partial_sparkgnn_vec_sum" in text
    assert "HashAggregate" in text and "ObjectHashAggregate" not in text and "SortAggregate" not in text


def test_empty_groups_nulls_and_nan(spark):
    nan = np.array([1.0, np.nan], np.float32).tobytes()
    one = np.array([2.0, -1.0], np.float32).tobytes()
    rows = [(0, one, 1.0), (0, None, 1.0), (0, one, None), (1, nan, 1.0), (1, one, 1.0)]
    spark.createDataFrame(rows, "g long, v binary, w float").createOrReplaceTempView("edge_cases")
    sums = _by_group(spark, "select g, sparkgnn_vec_sum(v, 2, w) from edge_cases group by g")
    np.testing.assert_array_equal(sums[0], [2.0, -1.0])  # rows with a null vector or weight are skipped
    assert np.isnan(sums[1][1]) and sums[1][0] == 3.0  # NaN propagates, element by element
    maxima = _by_group(spark, "select g, sparkgnn_vec_max(v, 2) from edge_cases group by g")
    assert np.isnan(maxima[1][1]) and maxima[1][0] == 2.0  # like torch.amax
    counted = _by_group(spark, "select g, sparkgnn_vec_sum_count(v, 2, w) from edge_cases group by g")
    assert counted[0][-1] == 1.0
    # no row at all (a global aggregate over nothing, or only null vectors): null, as SQL's sum
    empty = spark.sql("select sparkgnn_vec_sum(v, 2) from edge_cases where g > 5").collect()
    assert empty[0][0] is None
    only_null = spark.sql("select sparkgnn_vec_mean(v, 2) from edge_cases where v is null").collect()
    assert only_null[0][0] is None


def test_width_mismatch_names_both_widths(spark, vectors):
    with pytest.raises(Exception) as caught:
        spark.sql("select g, sparkgnn_vec_sum(v, 4) from vectors group by g").collect()
    assert f"sparkgnn_vec_sum: a vector of {4 * WIDTH} bytes ({WIDTH} floats) in an aggregate of width 4" in str(
        caught.value
    )
    rows = [(0, b"\x00" * 6)]
    spark.createDataFrame(rows, "g long, v binary").createOrReplaceTempView("ragged")
    with pytest.raises(Exception, match="not packed float32"):
        spark.sql("select sparkgnn_vec_max(v, 2) from ragged").collect()


def test_width_must_be_a_positive_integer_literal(spark, vectors):
    with pytest.raises(Exception, match="width must be an integer literal"):
        spark.sql("select sparkgnn_vec_sum(v, g) from vectors").collect()
    with pytest.raises(Exception, match="width must be positive"):
        spark.sql("select sparkgnn_vec_sum(v, 0) from vectors").collect()
    with pytest.raises(Exception, match=r"takes 2 or 3 arguments"):
        spark.sql("select sparkgnn_vec_sum(v) from vectors").collect()


def test_scale_and_conversions_round_trip(spark, vectors):
    x, _, weight = vectors
    rows = spark.sql(
        "select sparkgnn_vec_to_array(v) a, sparkgnn_vec_scale(v, w) s,"
        " sparkgnn_array_to_vec(sparkgnn_vec_to_array(v)) b, v, w from vectors limit 20"
    ).collect()
    for row in rows:
        values = np.frombuffer(row.v, np.float32)
        np.testing.assert_array_equal(np.array(row.a, np.float32), values)
        assert row.b == row.v
        np.testing.assert_allclose(np.frombuffer(row.s, np.float32), values * np.float32(row.w), rtol=1e-6)
    doubles = spark.sql("select sparkgnn_array_to_vec(array(1.5d, -2d)) v").collect()[0].v
    np.testing.assert_array_equal(np.frombuffer(doubles, np.float32), [1.5, -2.0])  # any numeric array, cast
    with pytest.raises(Exception, match="element 1 of the array is null"):
        spark.sql("select sparkgnn_array_to_vec(array(1.0f, null)) v").collect()


EXTENSIONS_SCRIPT = """
import sys
import numpy as np
from pyspark.sql import SparkSession
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.jars", sys.argv[1])
    .config("spark.sql.extensions", "org.sparkgnn.SparkGNNExtensions")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
v = np.array([1.0, 2.0], np.float32).tobytes()
spark.createDataFrame([(v,), (v,)], "v binary").createOrReplaceTempView("t")
print("SUM", np.frombuffer(spark.sql("select sparkgnn_vec_sum(v, 2) s from t").collect()[0].s, np.float32).tolist())
spark.stop()
"""


def test_spark_sql_extensions_install_the_functions_in_every_session(tmp_path):
    """What a Scala or SQL user does (no Python registration): --conf spark.sql.extensions=..."""
    import subprocess
    import sys

    script = tmp_path / "extensions.py"
    script.write_text(EXTENSIONS_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), jvm.jar_path()], capture_output=True, text=True, timeout=240, check=False
    )
    assert "SUM [2.0, 4.0]" in done.stdout, done.stderr[-2000:]
