"""Prepare's layouts written by the Python tasks (engine.prepare_tasks) equal the Spark SQL ones,
row for row and statistic for statistic."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.engine.degrees import PREPARED_STATS
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
    by_spark = prepare(spark, graph, partitions, str(tmp_path / "spark"), writer="spark")
    by_tasks = prepare(spark, graph, partitions, str(tmp_path / "tasks"), writer="tasks")
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
                if column in PREPARED_STATS:  # float sums, added in another order
                    np.testing.assert_allclose(a, e, rtol=1e-6)
                else:
                    np.testing.assert_array_equal(a, e, err_msg=f"{layout} part {part} column {column}")


def test_a_rerun_after_an_interrupted_preparation_replaces_its_files(spark, graph_dirs, tmp_path):
    path, _ = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    first = prepare(spark, graph, 3, str(tmp_path / "work"), writer="tasks")
    os.remove(os.path.join(first.path, "prepared.json"))  # as if the job died before the marker
    again = prepare(spark, graph, 3, str(tmp_path / "work"), writer="tasks")
    assert again.stats == first.stats and not again.reused
    files = [f for root, _, names in os.walk(os.path.join(again.path, "in_edges")) for f in names]
    assert len({f.split("-")[1] for f in files}) == 1  # one preparation's files only


def test_a_layout_of_an_older_version_is_prepared_again_not_reused(spark, graph_dirs, tmp_path):
    from sparkgnn import files
    from sparkgnn.engine.prepare import LAYOUT_VERSION, MARKER, is_prepared

    path, _ = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    work = str(tmp_path / "work")
    first = prepare(spark, graph, 2, work, writer="tasks")
    marker = os.path.join(first.path, MARKER)
    older = files.read_json(marker)
    assert older.pop("layout") == LAYOUT_VERSION
    files.write_json_atomic(marker, older)  # as an earlier version wrote it (vertices without some statistics)
    assert not is_prepared(graph, 2, work)
    again = prepare(spark, graph, 2, work, writer="tasks")
    assert not again.reused and again.stats == first.stats
    assert files.read_json(marker)["layout"] == LAYOUT_VERSION and is_prepared(graph, 2, work)
    assert prepare(spark, graph, 2, work, writer="tasks").reused
    assert set(PREPARED_STATS) <= set(_slice(again.path, "vertices", 0).column_names)
