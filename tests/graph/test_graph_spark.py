"""The Spark-side Graph: normalisation, load/save, stats, fingerprint parity with the numpy path,
and the same validation messages as the numpy path (shared cases in _graph_helpers.BROKEN)."""

import pathlib
import re
from types import SimpleNamespace

import numpy as np
import pytest
from _graph_helpers import BROKEN, arrow_types, write_raw

import sparkgnn
from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import Graph, read_graph_dir, write_graph_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_lazy_export_and_no_pyspark_imports():
    assert sparkgnn.Graph is Graph
    pattern = re.compile(r"^\s*(import|from)\s+pyspark\b", re.M)
    offenders = [
        str(p)
        for folder in ("python/sparkgnn/graph", "python/sparkgnn/datasets")
        for p in (ROOT / folder).rglob("*.py")
        if pattern.search(p.read_text())
    ]
    assert offenders == []


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_spark_validation_matches_numpy_wording(spark, case, tmp_path):
    vertices, edges, _, expected = BROKEN[case]
    path = write_raw(tmp_path, vertices, edges, vertex_types=arrow_types(vertices))
    with pytest.raises(GraphValidationError) as err:
        Graph.load(spark, path)  # no graph.json -> content is validated on load
    for line in expected:
        assert line in str(err.value)


def test_dataframes_are_normalised_and_fingerprinted_like_numpy(spark, small_graph):
    rows = [
        (int(i), [float(v) for v in row], int(y))
        for i, row, y in zip(small_graph.ids, small_graph.x, small_graph.y, strict=True)
    ]
    vertices = spark.createDataFrame(rows, "id int, x array<double>, y int")
    edges = spark.createDataFrame(
        [
            (int(s), int(d), float(w))
            for s, d, w in zip(small_graph.src_ids, small_graph.dst_ids, small_graph.weight, strict=True)
        ],
        "src int, dst int, weight double",
    )
    graph = Graph.from_graphframe(SimpleNamespace(vertices=vertices.withColumn("extra", vertices.id), edges=edges))
    assert graph.vertices.dtypes == [("id", "bigint"), ("x", "array<float>"), ("y", "bigint")]
    assert graph.edges.dtypes == [("src", "bigint"), ("dst", "bigint"), ("weight", "float")]
    assert graph.path is None and graph.feature_dim == 4
    assert graph.fingerprint == small_graph.fingerprint
    stats = graph.stats()
    assert stats == {
        "num_vertices": 6,
        "num_edges": 7,
        "feature_dim": 4,
        "num_classes": 3,
        "has_weight": True,
        "has_labels": True,
    }


def test_load_written_dir_uses_graph_json(spark, small_graph, tmp_path):
    write_graph_dir(small_graph, tmp_path / "g", rows_per_file=3)
    graph = Graph.load(spark, str(tmp_path / "g"))
    assert graph.path == str(tmp_path / "g") and graph.name == "small"
    assert graph.fingerprint == small_graph.fingerprint  # read from graph.json, no job
    assert graph.stats()["num_edges"] == 7 and graph.feature_dim == 4
    assert graph.vertices.dtypes[:2] == [("id", "bigint"), ("x", "array<float>")]
    back = graph.to_graph_data()
    order = np.argsort(back.ids)
    np.testing.assert_array_equal(back.x[order], small_graph.x[np.argsort(small_graph.ids)])
    expected = sorted(zip(small_graph.src_ids, small_graph.dst_ids, strict=True))
    assert sorted(zip(back.src_ids, back.dst_ids, strict=True)) == expected


def test_save_then_read_with_pyarrow(spark, small_graph, tmp_path):
    graph = Graph.from_graph_data(spark, small_graph)
    graph._fingerprint = None  # force the Spark (mapInArrow) computation
    meta = graph.save(str(tmp_path / "s"))
    assert meta["fingerprint"] == small_graph.fingerprint and meta["num_vertices"] == 6
    again = read_graph_dir(tmp_path / "s")  # Spark wrote x as a plain Parquet list
    assert again.fingerprint == small_graph.fingerprint
    del again.__dict__["fingerprint"]
    assert again.fingerprint == small_graph.fingerprint  # recomputed from the Spark-written files
    assert sorted(again.split.tolist()) == sorted(small_graph.split.tolist())
