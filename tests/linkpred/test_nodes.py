"""linkpred/nodes.py: when a scoring job computes every vertex instead of the pairs' neighbourhoods."""

from sparkgnn.linkpred.nodes import WHOLE_SHARE, pairs_cover_graph


class _NoSpark:
    """A pairs frame that fails if any Spark work is asked of it."""

    def select(self, *args, **kwargs):
        raise AssertionError("pairs_cover_graph ran a Spark job for too few pairs to cover the graph")


def test_too_few_pairs_cannot_cover_the_graph_and_run_no_spark_job():
    vertices = 1000
    few = int(WHOLE_SHARE * vertices / 2) - 1
    assert pairs_cover_graph(_NoSpark(), pair_count=few, num_vertices=vertices) is False


def test_pairs_cover_graph_counts_distinct_ids(spark):
    many = spark.createDataFrame([(i % 40, (i * 7) % 40) for i in range(200)], "src long, dst long")
    assert pairs_cover_graph(many, pair_count=200, num_vertices=60) is True  # 40 distinct ids >= 30
    assert pairs_cover_graph(many, pair_count=200, num_vertices=100) is False  # 40 < 50
