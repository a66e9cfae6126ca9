"""Prepare's layouts written by the Python tasks (engine.prepare_tasks) equal the Spark SQL ones,
row for row and statistic for statistic."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.engine.prepare import prepare
from sparkgnn.graph import Graph

SORT_KEYS = {"vertices": ["id"], "in_edges": ["src", "dst", "w"], "out_targets": ["id", "pt"]}


def _slice(prep_dir, layout, part):
    directory = os.path.join(prep_dir, layout, f"part={part}")
    if not os.path.isdir(directory):
        return None
    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
    table = pa.concat_tables([pq.read_table(os.path.join(directory, f)) for f in files])
    return table.sort_by([(k, "ascending") for k in SORT_KEYS[layout]])


@pytest.mark.parametrize(("graph_name", "partitions"), [("skewed", 3), ("cora", 8), ("skewed", 1)])
def test_tasks_write_the_layouts_spark_writes(spark, graph_dirs, tmp_path, graph_name, partitions):
    path, _ = graph_dirs[graph_name]
    graph = Graph.load(spark, path)
    by_spark = prepare(spark, graph, partitions, str(tmp_path / "spark"), log=lambda _: None, writer="spark")
    by_tasks = prepare(spark, graph, partitions, str(tmp_path / "tasks"), log=lambda _: None, writer="tasks")
    assert by_tasks.stats == by_spark.stats
    for layout in SORT_KEYS:
        for part in range(partitions):
            expected, actual = _slice(by_spark.path, layout, part), _slice(by_tasks.path, layout, part)
            if expected is None:
                assert actual is None, (layout, part)
                continue
            assert actual.column_names == expected.column_names
            for column in expected.column_names:
                a, e = actual.column(column).to_numpy(), expected.column(column).to_numpy()
                assert a.dtype == e.dtype, (layout, column)
                if column == "gcn_degree":
                    np.testing.assert_allclose(a, e, rtol=1e-6)
                else:
                    np.testing.assert_array_equal(a, e, err_msg=f"{layout} part {part} column {column}")


def test_a_rerun_after_an_interrupted_preparation_replaces_its_files(spark, graph_dirs, tmp_path):
    path, _ = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    first = prepare(spark, graph, 3, str(tmp_path / "work"), log=lambda _: None, writer="tasks")
    os.remove(os.path.join(first.path, "prepared.json"))  # as if the job died before the marker
    again = prepare(spark, graph, 3, str(tmp_path / "work"), log=lambda _: None, writer="tasks")
    assert again.stats == first.stats and not again.reused
    files = [f for root, _, names in os.walk(os.path.join(again.path, "in_edges")) for f in names]
    assert len({f.split("-")[1] for f in files}) == 1  # one preparation's files only


def test_degrees_of_isolated_vertices_and_self_loops():
    from sparkgnn.engine.prepare_tasks import _gcn_degree

    ids = np.array([1, 5, 9], np.int64)
    none = np.zeros(0, np.int64)
    assert _gcn_degree(ids, none, none, np.zeros(0, np.float32)).tolist() == [1.0, 1.0, 1.0]
    src, dst = np.array([5, 9, 9, 9, 1]), np.array([1, 9, 9, 1, 5])
    w = np.array([2.0, 3.0, 0.5, 1.5, 4.0], np.float32)
    # vertex 1: in-edges 2.0 + 1.5, no self loop (+1); 5: 4.0 + 1; 9: largest self loop 3.0
    assert _gcn_degree(ids, src, dst, w).tolist() == [4.5, 5.0, 3.0]
    with pytest.raises(ValueError, match="not vertices"):
        _gcn_degree(ids, np.array([1]), np.array([7]), np.ones(1, np.float32))
